"""Ray jobs through Ray's job submission API (what `ray job submit` calls): submit one, follow
its log to the end, its final status and the entrypoint's exit code."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from ray.job_submission import JobStatus
from ray.job_submission import JobSubmissionClient

from framework.base.errors import ClusterError


@dataclass(frozen=True)
class JobEnd:
    """A finished job: SUCCEEDED / FAILED / STOPPED, and the entrypoint's exit code (None when
    it never ran)."""

    status: str
    exit_code: int | None

    @property
    def succeeded(self) -> bool:
        return self.status == JobStatus.SUCCEEDED.value


def _client(address: str | None) -> JobSubmissionClient:
    """`address`: the dashboard's URL; None takes RAY_ADDRESS, else a local cluster's."""
    try:
        return JobSubmissionClient(address)
    except Exception as exc:  # noqa: BLE001 - any failure to reach the dashboard is the cluster error
        raise ClusterError(f"could not reach Ray's job API at {address or 'RAY_ADDRESS'}: "
                           f"{exc}") from None


def submit(address: str | None, entrypoint: str, working_dir: str,
           submission_id: str | None = None) -> str:
    """Submit `entrypoint` (a shell command) to run in `working_dir` (a path or Ray URI);
    returns the submission id."""
    try:
        return _client(address).submit_job(entrypoint=entrypoint, submission_id=submission_id,
                                           runtime_env={"working_dir": working_dir})
    except ClusterError:
        raise
    except Exception as exc:  # noqa: BLE001 - Ray raises RuntimeError with the HTTP answer
        raise ClusterError(f"job submission to {address or 'RAY_ADDRESS'} failed: {exc}") from None


def follow(address: str | None, job_id: str, write: Callable[[str], None],
           poll_s: float = 2.0) -> JobEnd:
    """Pass the job's log to `write` as it grows, until the job is finished."""
    client = _client(address)
    shown = 0
    while True:
        status = client.get_job_status(job_id)
        logs = client.get_job_logs(job_id)
        if len(logs) > shown:
            write(logs[shown:])
            shown = len(logs)
        if status.is_terminal():
            info = client.get_job_info(job_id)
            tail = client.get_job_logs(job_id)
            if len(tail) > shown:
                write(tail[shown:])
            return JobEnd(status.value, info.driver_exit_code)
        time.sleep(poll_s)
