"""One trial on one server, without Ray: start, ready, warm-up, the measured load and its
statistics (`run`, `measure`, `capacity`, `stats`), the SLA verdict (`objective`) and the
outcome judged as recorded (`judge`). Defines
the `ServerLauncher` / `ServerHandle` interface that `cluster` implements."""

from framework.base.exports import lazy_exports

__getattr__, __all__ = lazy_exports(__name__, {
    "run_trial": "run",
    "TrialOutcome": "run",
    "ServerHandle": "run",
    "ServerLauncher": "run",
    "LoadPlan": "measure",
    "Verdict": "objective",
    "evaluate": "objective",
    "gain": "objective",
    "mean_ci": "stats",
})
