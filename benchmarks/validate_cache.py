"""`vllm-sweep validate` with and without the vLLM flag cache (framework/engine/flag_cache.py):
a cold cache (a new empty $VLLM_SWEEP_CACHE_DIR each run: vLLM imported, its parser built) against
a warm one (filled once before the runs), alternated, whole-process wall and CPU seconds.

    .venv/bin/python benchmarks/validate_cache.py [--runs 3] [--sweep sweeps/quickstart.yaml] [--no-doc]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC
from datetime import datetime
from pathlib import Path

try:
    from record import ROOT
    from record import append_section
    from record import uptime
except ModuleNotFoundError:  # imported as benchmarks.validate_cache
    from benchmarks.record import ROOT
    from benchmarks.record import append_section
    from benchmarks.record import uptime

CLI = Path(sys.executable).parent / "vllm-sweep"


def timed_validate(sweep: Path, cache: Path) -> tuple[float, float]:
    """(wall s, CPU s) of one `vllm-sweep validate` child that must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run([str(CLI), "validate", str(sweep)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600,
                          env={**os.environ, "VLLM_SWEEP_CACHE_DIR": str(cache)})
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"validate failed ({proc.returncode}): {proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def cell(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sweep", type=Path, default=ROOT / "sweeps" / "quickstart.yaml")
    parser.add_argument("--no-doc", action="store_true")
    args = parser.parse_args()
    started, load_before = datetime.now(UTC), uptime()
    runs: dict[str, list[tuple[float, float]]] = {"cold": [], "warm": []}
    with tempfile.TemporaryDirectory(prefix="validate-cache-") as tmp:
        warm = Path(tmp) / "warm"
        timed_validate(args.sweep, warm)  # fills it
        for i in range(args.runs):
            for name in (("cold", "warm") if i % 2 == 0 else ("warm", "cold")):
                cache = warm if name == "warm" else Path(tempfile.mkdtemp(dir=tmp))
                runs[name].append(timed_validate(args.sweep, cache))
                print(f"run {i} {name}: {runs[name][-1][0]:.2f} s wall", flush=True)
    ratios = [w[0] / c[0] for w, c in zip(runs["warm"], runs["cold"])]
    table = "\n".join([
        "| validate | wall s | CPU s |", "| --- | ---: | ---: |",
        *(f"| {n} cache | {cell([r[0] for r in runs[n]])} | {cell([r[1] for r in runs[n]])} |"
          for n in ("cold", "warm")),
        f"| warm / cold, pair by pair | {cell(ratios)} | |",
    ])
    print(table)
    if not args.no_doc:
        append_section(
            "Validate with the vLLM flag cache", f"Command: `.venv/bin/python benchmarks/"
            f"validate_cache.py --runs {args.runs}` (`vllm-sweep validate {args.sweep.name}`, "
            "cold and warm alternated; cells: median [min-max]).\n\nMachine load: before "
            f"`{load_before}`; after `{uptime()}`.", table, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
