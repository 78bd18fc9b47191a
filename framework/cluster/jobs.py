"""Ray jobs through Ray's job submission API (what `ray job submit` calls): submit one, follow
its log to the end, its final status and the entrypoint's exit code.

`ray job stop` makes Ray's job supervisor SIGTERM the entrypoint and its children, then
SIGKILL them after $RAY_JOB_STOP_WAIT_TIME_S as the supervisor's environment holds it, 3 s by
default (ray/dashboard/modules/job/job_supervisor.py, DEFAULT_RAY_JOB_STOP_WAIT_TIME_S; Ray
2.60). The supervisor actor gets the job's runtime_env env_vars (job_manager.py,
`_get_supervisor_runtime_env`), so `submit` sets it there: long enough for the driver's clean
stop (`stop_wait_s`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from ray.job_submission import JobStatus
from ray.job_submission import JobSubmissionClient

from framework.base.errors import ClusterError
from framework.cluster.node_reap import SHUTDOWN_GRACE_S
from framework.cluster.server import WORKER_GRACE_S

STOP_WAIT_VAR = "RAY_JOB_STOP_WAIT_TIME_S"


def stop_wait_s(servers: int) -> int:
    """Seconds `ray job stop` must wait between SIGTERM and SIGKILL for a driver holding
    `servers` servers to stop cleanly: vLLM's own shutdown (SHUTDOWN_GRACE_S), then each
    server's workers in turn (WORKER_GRACE_S each; `RayLauncher.stop_all` stops one after
    another)."""
    return math.ceil(SHUTDOWN_GRACE_S + WORKER_GRACE_S * max(servers, 1))


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
           submission_id: str | None = None, stop_wait: int | None = None) -> str:
    """Submit `entrypoint` (a shell command) to run in `working_dir` (a path or Ray URI), with
    `stop_wait` seconds between `ray job stop`'s SIGTERM and SIGKILL (None: Ray's 3 s);
    returns the submission id."""
    runtime_env: dict[str, object] = {"working_dir": working_dir}
    if stop_wait is not None:
        runtime_env["env_vars"] = {STOP_WAIT_VAR: str(stop_wait)}
    try:
        return _client(address).submit_job(entrypoint=entrypoint, submission_id=submission_id,
                                           runtime_env=runtime_env)
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
