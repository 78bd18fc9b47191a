"""The sweep's connection to Ray: a private local Ray, or a cluster it joins."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass

import ray

from framework.base.errors import ClusterError
from framework.cluster.driver_session import SESSION_VAR
from framework.cluster.driver_session import reap_session

# A private local Ray's node address: loopback, so nothing it starts listens on the machine's
# own address. Not 127.0.0.1, which Ray replaces with the machine's address
# (ray/_private/services.py, resolve_ip_for_localhost).
LOCAL_NODE_IP = "127.0.0.100"


@dataclass
class RaySession:
    """Connects to Ray for the sweep: joins `address` (or RAY_ADDRESS) if given, else starts a
    private local Ray in its own temp dir and stops it on close.

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

    def __enter__(self) -> RaySession:
        if self.is_local:
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            self._temp_dir = tempfile.mkdtemp(prefix="vsweep-ray-")
            try:
                ray.init(address="local", num_cpus=self.num_cpus or os.cpu_count(),
                         num_gpus=self.num_gpus, _node_ip_address=LOCAL_NODE_IP,
                         include_dashboard=False, _temp_dir=self._temp_dir, log_to_driver=False,
                         logging_level="WARNING")
            except Exception as exc:  # noqa: BLE001 - any failure to start Ray is the cluster error
                raise ClusterError(f"could not start a local Ray: {exc}") from None
        else:
            try:
                ray.init(address=self.address or "auto", log_to_driver=False,
                         logging_level="WARNING")
            except Exception as exc:  # noqa: BLE001 - any failure to join Ray is the cluster error
                raise ClusterError(f"could not join Ray at {self.address or os.environ.get('RAY_ADDRESS')}: "
                                   f"{exc}") from None
        return self

    def __exit__(self, *exc) -> None:
        ray.shutdown()
        if self._temp_dir:
            reap_session(os.environ.get(SESSION_VAR, ""), grace_s=20.0)
            shutil.rmtree(self._temp_dir, ignore_errors=True)
