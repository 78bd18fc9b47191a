"""The exception tree. Anything a user can cause carries enough to print one clear line."""

from __future__ import annotations

from typing import Any


class SweepError(Exception):
    """Base of every error vllm-sweep raises on purpose."""


class ConfigError(SweepError):
    """Bad input in a sweep or search-space file: names the file, the key and the value."""

    def __init__(self, file: str, key: str, value: Any, reason: str) -> None:
        self.file, self.key, self.value, self.reason = file, key, value, reason
        super().__init__(f"{file}: {key}: {value!r}: {reason}")

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, str, Any, str]]:
        return (ConfigError, (self.file, self.key, self.value, self.reason))


class ClusterError(SweepError):
    """Ray could not be started or joined, or a trial's resources can never be placed."""


class StoreError(SweepError):
    """The results' object store could not be read or written (one line: the URI and why)."""


class TrialError(SweepError):
    """A trial ended in a failure with a reason from `FAIL_REASONS`."""

    def __init__(self, reason: str, detail: str, log_tail: str = "") -> None:
        self.reason, self.detail, self.log_tail = reason, detail, log_tail
        super().__init__(f"{reason}: {detail}")

    def __reduce__(self) -> tuple[type[TrialError], tuple[str, str, str]]:  # crosses Ray task boundaries
        return (TrialError, (self.reason, self.detail, self.log_tail))


FAIL_REASONS = (
    "invalid_args",      # vLLM rejected the arguments
    "startup_crash",     # the server died before it was ready
    "startup_timeout",   # not ready by the deadline
    "server_died",       # the server exited during the load
    "load_failed",       # every request of the measured run failed
    "kv_not_transferred",  # prefill/decode: the decode servers loaded no KV (connector broken)
    "node_lost",         # a node holding one of the trial's bundles died
    "devices_held",      # a start-up OOM on devices an earlier server's processes still held
    "unplaceable",       # the trial's placement group can never fit the cluster
    "interrupted",       # the driver stopped (Ctrl-C, SIGTERM, kill -9 then resume)
    "internal",          # a bug in vllm-sweep; the message says where
)
