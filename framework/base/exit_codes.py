"""`vllm-sweep`'s exit codes, defined once (framework/cli.py's docstring says when each is used;
README's "Exit codes" and tests/e2e/test_decision_fake.py check them)."""

EXIT_OK = 0
EXIT_NOTHING = 1  # `best` / `export`: no configuration to print
EXIT_BAD_INPUT = 2  # one line naming file, key and value
EXIT_CLUSTER = 3  # Ray could not be started or joined; a `doctor` check failed
EXIT_NO_FEASIBLE = 4  # `run` ended and no configuration meets the SLA
EXIT_INTERRUPTED = 130  # Ctrl-C / SIGTERM: servers stopped, results kept
