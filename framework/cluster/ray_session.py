"""The sweep's connection to Ray: a private local Ray, or a cluster it joins."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psutil
import ray
from ray.job_config import JobConfig

from framework.base.errors import ClusterError
from framework.cluster.driver_session import SESSION_VAR
from framework.cluster.driver_session import reap_session
from framework.engine import run_folder

# A private local Ray's node address: loopback, so nothing it starts listens on the machine's
# own address. Not 127.0.0.1, which Ray replaces with the machine's address
# (ray/_private/services.py, resolve_ip_for_localhost).
LOCAL_NODE_IP = "127.0.0.100"


# Ray 2.60 gives a starting node 30 s to register its raylet with the GCS, a fixed wait
# (ray/_private/node.py, `raylet_start_wait_time_s = 30`), then raises STARTUP_TIMEOUT; on a
# machine whose cores are busy (measured: two lanes of tests and two CPU burners on 2 cores) a
# private Ray can miss it. Such a start is retried, from a new temp dir, up to START_ATTEMPTS.
STARTUP_TIMEOUT = "timed out during startup"
START_ATTEMPTS = 3


def end_partial_start(temp_dir: str) -> list[int]:
    """SIGKILL this process's descendants that a failed ray.init left running in `temp_dir`
    (GCS, raylet, dashboard agent, monitors: each names the temp dir on its command line);
    their pids."""
    ray.shutdown()
    ended: list[psutil.Process] = []
    for child in psutil.Process().children(recursive=True):
        try:
            if any(temp_dir in arg for arg in child.cmdline()):
                child.kill()
                ended.append(child)
        except psutil.Error:
            continue
    psutil.wait_procs(ended, timeout=10)
    return [p.pid for p in ended]


@dataclass
class RaySession:
    """Connects to Ray for the sweep: joins `address` (or RAY_ADDRESS) if given, else starts a
    private local Ray in its own temp dir and stops it on close.

    The private Ray's temp dir is RAY_DIR in this node's run folder (engine.run_folder: 0700,
    ours): Ray makes its own folders mode 0777 (ray/_common/utils.py try_make_directory_shared),
    which no other user can reach below ours. Without a session id (SESSION_VAR) it is a fresh
    mkdtemp folder, as before. On close the run folder goes, once Ray and every process of the
    session are down. The driver's job carries the session id in its metadata, so the next run
    on the cluster knows this run's folders as alive (cluster.run_cleanup).

    Authentication: a private local Ray listens on loopback (LOCAL_NODE_IP) only and runs with
    RAY_AUTH_MODE=disabled unless the caller set a mode. A joined cluster gets the caller's
    environment untouched, so Ray's token authentication (RAY_AUTH_MODE=token with the token
    in RAY_AUTH_TOKEN or ~/.ray/auth_token) works as Ray documents it."""

    address: str | None
    num_cpus: int | None = None
    num_gpus: int | None = None
    _temp_dir: str | None = None

    @property
    def is_local(self) -> bool:
        return self.address is None and not os.environ.get("RAY_ADDRESS")

    def _private_temp_dir(self) -> str:
        session = os.environ.get(SESSION_VAR)
        if not session:
            return tempfile.mkdtemp(prefix="vsweep-ray-")
        try:
            return str(run_folder.make_dir(run_folder.this_run() / run_folder.RAY_DIR))
        except OSError as exc:
            raise ClusterError(f"could not start a local Ray: run folder: {exc}") from None

    def __enter__(self) -> RaySession:
        session = os.environ.get(SESSION_VAR)
        job = JobConfig(metadata={SESSION_VAR: session}) if session else None
        if self.is_local:
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            for attempt in range(1, START_ATTEMPTS + 1):
                self._temp_dir = self._private_temp_dir()
                try:
                    ray.init(address="local", num_cpus=self.num_cpus or os.cpu_count(),
                             num_gpus=self.num_gpus, _node_ip_address=LOCAL_NODE_IP,
                             include_dashboard=False, _temp_dir=self._temp_dir,
                             log_to_driver=False, logging_level="WARNING", job_config=job)
                    break
                except Exception as exc:  # noqa: BLE001 - any failure to start Ray is the cluster error
                    end_partial_start(self._temp_dir)
                    self._remove_temp_dir()
                    if attempt == START_ATTEMPTS or STARTUP_TIMEOUT not in str(exc):
                        raise ClusterError(f"could not start a local Ray: {exc}") from None
        else:
            try:
                ray.init(address=self.address or "auto", log_to_driver=False,
                         logging_level="WARNING", job_config=job)
            except Exception as exc:  # noqa: BLE001 - any failure to join Ray is the cluster error
                raise ClusterError(f"could not join Ray at {self.address or os.environ.get('RAY_ADDRESS')}: "
                                   f"{exc}") from None
        return self

    def __exit__(self, *exc) -> None:
        ray.shutdown()
        if self._temp_dir:
            reap_session(os.environ.get(SESSION_VAR, ""), grace_s=20.0)
            self._remove_temp_dir()

    def _remove_temp_dir(self) -> None:
        """The private Ray's temp dir, and the run folder that holds it (everything of the run
        on this node: its processes are gone by now)."""
        assert self._temp_dir is not None
        folder = Path(self._temp_dir).parent
        if Path(self._temp_dir).name == run_folder.RAY_DIR and folder.name.startswith(
                run_folder.folder_prefix()):
            try:
                run_folder.remove(folder)
            except OSError:
                pass  # no longer ours as made (run_folder.verify): not ours to remove
        else:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
        self._temp_dir = None
