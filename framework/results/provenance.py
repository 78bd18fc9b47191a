"""Where a trial's numbers came from, stamped on every trial row: code, hardware, model, load.

- vllm_sweep_commit: `git rev-parse HEAD` of the checkout the package runs from ("unknown"
  outside a git checkout, e.g. under `ray job submit`'s unpacked working dir).
- hardware: "cpu: <model name> x <logical cores>" for the CPU engine; for GPU and fake
  engines the cluster's GPU total and Ray's accelerator types ("gpu: 8 x A100-80G").
- model_config_sha256: SHA-256 of the model folder's config.json bytes.
- workload_sha256: SHA-256 of the workload section (canonical JSON; the `workloads:` list when
  there are several) plus the dataset files' bytes when there are some (a mix class's too):
  equal digests mean the same requests were sent.
- sampling: the sampling fields every request carried (workload.sampling), as compact JSON with
  sorted keys, "{}" when none was set (the server's defaults applied); the same function
  (framework.load.sampling.sampling_json) as `vllm-sweep bench`'s `sampling` key.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path

from framework.config.specs import SweepSpec
from framework.load.sampling import sampling_from
from framework.load.sampling import sampling_json

PACKAGE_DIR = Path(__file__).resolve().parent
PROVENANCE_COLUMNS: list[tuple[str, str]] = [
    ("vllm_sweep_commit", "str"), ("hardware", "str"), ("device_count", "int"),
    ("model_path", "str"), ("model_config_sha256", "str"), ("workload_sha256", "str"),
    ("sampling", "str"),
]


def git_commit(where: Path = PACKAGE_DIR) -> str:
    try:
        out = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def file_sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def workload_sha256(spec: SweepSpec) -> str:
    """The workload section (with several, the list of them), then each dataset file's bytes
    (the workloads' and their mix classes')."""
    section = ([w.model_dump(mode="json") for w in spec.workloads] if spec.workloads
               else spec.workload.model_dump(mode="json"))
    digest = hashlib.sha256(json.dumps(section, sort_keys=True, default=str).encode())
    for w in spec.workloads or (spec.workload,):
        for path in (w.dataset_path, *(c.dataset_path for c in w.mix)):
            if path is not None:
                digest.update((file_sha256(path) or "").encode())
    return digest.hexdigest()


def cpu_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def hardware(engine: str, nodes: Sequence[Mapping[str, float]]) -> tuple[str, int]:
    """(description, device count) of the cluster a sweep runs on."""
    if engine == "cpu":
        cores = os.cpu_count() or 0
        return f"cpu: {cpu_name()} x {cores}", int(sum(n.get("CPU", 0) for n in nodes)) or cores
    gpus = int(sum(n.get("GPU", 0) for n in nodes))
    kinds = sorted({k.split(":", 1)[1] for n in nodes for k in n if k.startswith("accelerator_type:")})
    return f"gpu: {gpus} x {', '.join(kinds) or 'unknown type'}", gpus


def provenance(spec: SweepSpec, nodes: Sequence[Mapping[str, float]]) -> dict[str, object]:
    """The provenance columns' values for every trial of this sweep run."""
    described, count = hardware(spec.engine, nodes)
    return {"vllm_sweep_commit": git_commit(), "hardware": described, "device_count": count,
            "model_path": str(spec.model.resolve()),
            "model_config_sha256": file_sha256(spec.model / "config.json"),
            "workload_sha256": workload_sha256(spec),
            "sampling": sampling_json(sampling_from(spec.workload.sampling.set_fields()))}
