"""One trial on one server, without Ray: start, ready, warm-up, the measured load and its
statistics (`run`, `measure`, `capacity`, `stats`), and the SLA verdict (`objective`). Defines
the `ServerLauncher` / `ServerHandle` interface that `cluster` implements."""
