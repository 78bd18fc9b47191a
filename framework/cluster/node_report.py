"""What `vllm-sweep doctor` learns of one node (`NodeReport`), and the pure helpers the probe
on the node uses. No Ray here: `node_probe` runs the probe on each node, `sweep.doctor` turns
reports into checks."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

MIN_FREE_PORTS = 4  # server ports that must bind on each node
VERSION_KEYS = ("vllm", "torch", "cuda", "ray", "python")
MISSING = "missing"


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_gib: float


@dataclass(frozen=True)
class NodeReport:
    """What `node_probe.probe_node` saw on one node, plus Ray's total resources of it. `gpus`
    are the CUDA devices torch sees (`cuda_visible` of them), else nvidia-smi's list; `error`
    set means the probe itself failed and nothing else is known."""

    node_ip: str
    node_id: str = ""
    resources: Mapping[str, float] = field(default_factory=dict)
    gpus: tuple[Gpu, ...] = ()
    cuda_visible: int = 0
    versions: Mapping[str, str] = field(default_factory=dict)  # VERSION_KEYS -> version
    cache_dir: str = ""  # as expanded on the node
    cache_error: str = ""  # "" = writable
    free_ports: int = 0  # of MIN_FREE_PORTS picked in SERVER_PORTS
    error: str = ""

    @property
    def ray_gpus(self) -> int:
        return int(self.resources.get("GPU", 0))


def writable(path: Path) -> str:
    """"" if a file can be created in `path` (made with its parents if missing), else why not."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".vllm-sweep-doctor-"):
            pass
    except OSError as exc:
        return f"not writable: {exc.strerror or exc}"
    return ""


def parse_nvidia_smi(text: str) -> tuple[Gpu, ...]:
    """`nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits` -> GPUs."""
    gpus = []
    for line in text.splitlines():
        name, _, mib = line.rpartition(",")
        try:
            gpus.append(Gpu(name.strip(), float(mib) / 1024))
        except ValueError:
            continue
    return tuple(g for g in gpus if g.name)
