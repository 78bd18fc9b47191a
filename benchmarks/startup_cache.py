"""Start-up cost with vLLM's compile cache: first start of a configuration vs second.

    .venv/bin/python benchmarks/startup_cache.py [--no-doc]

Starts `vllm serve` of the tiny model (torch.compile on, i.e. without --enforce-eager) with a
fresh, empty VLLM_CACHE_ROOT, as the first trial of a sweep on a new node does, then again
with the cache it filled (what every later trial of the same flags gets: vllm-sweep points
VLLM_CACHE_ROOT of every server on a node at one folder, `.cache/vllm`, across trials and
sweeps); then a second configuration (other --max-num-seqs) on that cache, twice; then the
first configuration with --enforce-eager (no compilation at all) for reference. Per start:
seconds from Popen to the first 200 of /health. One start each: the difference of interest
(tens of seconds) is far above the start-up noise (a few seconds, docs/BENCHMARKS.md). Prints the
table and appends it to docs/BENCHMARKS.md unless --no-doc.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from datetime import UTC
from datetime import datetime
from pathlib import Path

from loadgen_parity import MODEL
from loadgen_parity import VllmServer
from record import append_section
from record import uptime

STARTS = [  # (label, extra args, eager)
    ("A, first start (empty cache)", ("--max-num-seqs", "64"), False),
    ("A, second start (cache from the first)", ("--max-num-seqs", "64"), False),
    ("B, first start (cache holds A)", ("--max-num-seqs", "16"), False),
    ("B, second start", ("--max-num-seqs", "16"), False),
    ("A with --enforce-eager (no compile)", ("--max-num-seqs", "64"), True),
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--no-doc", action="store_true")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sc-", dir="/tmp"))
    cache = work / "vllm-cache"
    load_before = uptime()
    started = datetime.now(UTC)
    rows = []
    for i, (label, extra, eager) in enumerate(STARTS):
        t0 = time.monotonic()
        with VllmServer(MODEL, work / f"server-{i}.log", extra, eager=eager,
                        env={"VLLM_CACHE_ROOT": str(cache), "TMPDIR": str(work)}):
            ready = time.monotonic() - t0
        size = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()) / 2**20
        rows.append((label, " ".join(extra) + (" --enforce-eager" if eager else ""), ready, size))
        print(f"  {label}: ready in {ready:.1f} s; cache {size:.1f} MiB", flush=True)
    first, second = rows[0][2], rows[1][2]
    lines = ["| start | flags | ready s | cache after (MiB) |", "| --- | --- | ---: | ---: |"]
    lines += [f"| {label} | `{flags}` | {ready:.1f} | {size:.1f} |" for label, flags, ready, size in rows]
    lines += ["", f"Second start of the same configuration: {second:.1f} s vs {first:.1f} s first "
              f"({100 * (first - second) / first:.0f}% less); a new configuration on the shared "
              f"cache: {rows[2][2]:.1f} s, its second start {rows[3][2]:.1f} s; eager (no "
              f"compile): {rows[4][2]:.1f} s."]
    text = "\n".join(lines)
    print("\n" + text)
    if not args.no_doc:
        append_section("Start-up with the shared compile cache (issue 8)",
                       "Command: `.venv/bin/python benchmarks/startup_cache.py`. Machine: "
                       f"{os.cpu_count()} cores, CPU vLLM 0.32, tiny model, --max-model-len 1024. "
                       f"Load before: `{load_before}`.", text, started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
