"""Ray: the sweep's Ray session, one placement group and one server actor per trial, the
release of a trial's devices. The only package importing ray.

- `ray_session`: a private local Ray (loopback) or a joined cluster;
- `launcher`: `RayLauncher` (trial.ServerLauncher): a trial's group, laid out so a stage's TP
  ranks share a node, and its server actor;
- `server`: `RayServer` (trial.ServerHandle): stop and release (every process on every node
  gone first), the log fetched to the driver, control commands to the server;
- `actors`: `ServerActor` (devices held as vLLM uses them) and FakeEngine's `FakeWorker`;
- `devices`: which physical GPU each process of a trial computes on, as vLLM picks it (pure;
  the fake-GPU contract FakeEngine's workers follow);
- `jobs`: Ray's job submission API (`vllm-sweep submit`);
- `shared_folder`: cluster.shared_folder checked on every node (prefill/decode across nodes).
"""

from framework.cluster.actors import OCCUPANCY_LOG_ENV
from framework.cluster.actors import FakeWorker
from framework.cluster.actors import ServerActor
from framework.cluster.launcher import RayLauncher
from framework.cluster.launcher import node_resources
from framework.cluster.ray_session import RaySession
from framework.cluster.server import NODE_DEATH_DETECTION_S
from framework.cluster.server import RayServer
from framework.cluster.server import group_processes

__all__ = ["NODE_DEATH_DETECTION_S", "OCCUPANCY_LOG_ENV", "FakeWorker", "RayLauncher",
           "RayServer", "RaySession", "ServerActor", "group_processes", "node_resources"]
