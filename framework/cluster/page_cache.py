"""The `page_cache` start-up lever (framework.engine.startup_levers): a trial's model weights
read into its node's page cache while its server imports torch and vLLM, so that vLLM's weight
loading reads from memory. A Ray task with no CPU reservation on the trial's node, at niceness
19 (Ray's RAY_worker_niceness, as framework.cluster.launcher sets 0 for servers); fire and
forget: a failed read-ahead costs nothing but the time it would have saved."""

from __future__ import annotations

import os
from pathlib import Path

import ray
from ray._private.ray_constants import RAY_WORKER_NICENESS
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

CHUNK = 16 << 20
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


def weight_files(model_dir: Path) -> list[Path]:
    """The model's weight files, largest first (a missing dir has none: a hub id is not local)."""
    if not model_dir.is_dir():
        return []
    files = [p for p in model_dir.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES]
    return sorted(files, key=lambda p: p.stat().st_size, reverse=True)


def read_into_page_cache(model_dir: str) -> int:
    """posix_fadvise(WILLNEED) then a sequential read of every weight file; bytes read."""
    total = 0
    for path in weight_files(Path(model_dir)):
        with open(path, "rb", buffering=0) as fh:
            os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)
            while chunk := fh.read(CHUNK):
                total += len(chunk)
    return total


_read_ahead = ray.remote(num_cpus=0, max_retries=0)(read_into_page_cache)


def start_read_ahead(model_dir: str, node_id: str) -> ray.ObjectRef:
    """Start reading `model_dir` on node `node_id` (soft affinity); returns without waiting."""
    return _read_ahead.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=True),
        runtime_env={"env_vars": {RAY_WORKER_NICENESS: "19"}}).remote(model_dir)
