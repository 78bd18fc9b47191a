"""What torch inductor's precompiled C++ header costs a vLLM CPU server start (#31).

    .venv/bin/python benchmarks/precompiled_header.py [--pairs 4] [--no-doc]

Torch precompiles its kernel header into `<temp dir>/torchinductor_<user>/precompiled_headers`
(torch/_inductor/codecache.py `_HEADER_DIR`), not under TORCHINDUCTOR_CACHE_DIR, and does so
before it loads any cached CPU kernel (`CppCodeCache.load_async`), even one whose library is on
disk. A server's temp dir is its private run folder, so every start paid it until the launcher
set TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS=0 (framework/cluster/actors.py).

Each start here: a child that builds vLLM's engine in-process (`LLM`, the tiny model,
--enforce-eager as every CPU example ships, VLLM_ENABLE_V1_MULTIPROCESSING=0 so that all of it
is one process and its compiler children) and generates for 9 prompts, greedy, top-p/top-k and
sampled with logprobs (what a server gets; the sampler's torch.compile'd CPU kernels are what
load the header), with a fresh private
TMPDIR (as a run folder) and this checkout's warm caches (.cache/vllm, .cache/inductor). Its
CPU is that of every process carrying the start's marker (the compilers torch's workers run
included). Header on and off alternate
within each pair; the table gives each pair's difference and their median with a 95% interval
(benchmarks/paired.py median_ci). Appended to docs/BENCHMARKS.md unless --no-doc.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC
from datetime import datetime
from pathlib import Path

import psutil
from paired import median_ci
from record import append_section
from record import uptime

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "tiny-llama"
VAR = "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS"
MARK = "VSWEEP_PCH_BENCH"  # tags one start's processes
POLL_S = 0.2
CHILD = """
from vllm import LLM, SamplingParams
llm = LLM(%r, max_model_len=512, enforce_eager=True)
kinds = [SamplingParams(max_tokens=16, ignore_eos=True, temperature=0.0),
         SamplingParams(max_tokens=16, ignore_eos=True, top_p=0.9, top_k=10),
         SamplingParams(max_tokens=16, ignore_eos=True, temperature=1.0, logprobs=1)]
llm.generate(["hello world " * 10] * 9, [kinds[i %% 3] for i in range(9)])
"""

def one_start(header: bool) -> tuple[float, float]:
    """(CPU s, wall s) of one engine start and generation with the header on or off: the CPU
    of every process that carries this start's marker (the child, torch's compile workers and
    the compilers they run), read from /proc every POLL_S (a process that lives less than that
    is missed: its CPU is small by construction)."""
    marker = uuid.uuid4().hex
    seen: dict[tuple[int, float], float] = {}
    with tempfile.TemporaryDirectory(prefix="vsweep-pch-") as tmp:
        env = dict(os.environ, TMPDIR=tmp, VLLM_ENABLE_V1_MULTIPROCESSING="0",
                   VLLM_CPU_KVCACHE_SPACE="1", VLLM_CACHE_ROOT=str(ROOT / ".cache" / "vllm"),
                   TORCHINDUCTOR_CACHE_DIR=str(ROOT / ".cache" / "inductor"),
                   **{VAR: "1" if header else "0", MARK: marker})
        start = time.monotonic()
        child = subprocess.Popen([sys.executable, "-c", CHILD % str(MODEL)], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while child.poll() is None:
            for proc in psutil.process_iter():
                try:
                    if proc.environ().get(MARK) == marker:
                        times = proc.cpu_times()
                        seen[(proc.pid, proc.create_time())] = times.user + times.system
                except psutil.Error:
                    continue
            time.sleep(POLL_S)
        wall = time.monotonic() - start
    if child.returncode != 0:
        raise SystemExit(f"the engine start failed (exit code {child.returncode})")
    return sum(seen.values()), wall


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--no-doc", action="store_true")
    args = parser.parse_args()
    one_start(False)  # fills the caches for the kernels' off-header key, not measured
    started = datetime.now(UTC)
    rows = []
    for pair in range(args.pairs):
        order = (True, False) if pair % 2 == 0 else (False, True)
        result = {header: one_start(header) for header in order}
        rows.append(result)
        print(f"pair {pair}: on {result[True][0]:.1f} core-s {result[True][1]:.1f} s, "
              f"off {result[False][0]:.1f} core-s {result[False][1]:.1f} s", flush=True)
    preamble = (f"`.venv/bin/python benchmarks/precompiled_header.py --pairs {args.pairs}`: one "
                "vLLM CPU engine start (tiny model, --enforce-eager, warm caches, a fresh "
                "TMPDIR) with torch's precompiled header on and off, alternating within each "
                f"pair. Load at the end: {uptime()}.")
    lines = ["| per start | header on (median) | off (median) | on - off per pair: median [95% CI] |",
             "|---|---|---|---|"]
    for index, label in ((0, "CPU (core-s)"), (1, "wall (s)")):
        on = [r[True][index] for r in rows]
        off = [r[False][index] for r in rows]
        med, low, high = median_ci([a - b for a, b in zip(on, off)])
        lines.append(f"| {label} | {statistics.median(on):.1f} | {statistics.median(off):.1f} "
                     f"| {med:.1f} [{low:.1f}, {high:.1f}] |")
    print(preamble + "\n\n" + "\n".join(lines))
    if not args.no_doc:
        append_section("Torch's precompiled header per vLLM CPU start", preamble,
                       "\n".join(lines), started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
