"""Results at scale (issue #35 item 4): docs/RESULTS.md's worked queries, as written, on a synthetic
sweep of TRIALS trials x REQUESTS requests, before and after `vllm-sweep compact`.

    python -m benchmarks.results_scale [--trials 10000] [--requests 1000] [--rounds 3] [--no-doc]

The sweep is made in the store's layout with its schemas (results.rows: the trial columns of
search_spaces/tiny_cpu.yaml, REQUEST_COLUMNS), one file per trial and table as a sweep writes
them, in a private temp folder; a copy is then compacted (results.compaction). Each round runs
every documented query (the fenced `# results-query:` blocks of docs/RESULTS.md, RESULTS set to
the folder) once on each copy, alternating which copy goes first; the table gives each query's
median seconds over the rounds and the min-max. Appends to docs/BENCHMARKS.md unless --no-doc.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import tempfile
import time
from datetime import UTC
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.record import ROOT
from benchmarks.record import append_section
from benchmarks.record import uptime
from framework.config.search_space import load_search_space
from framework.results.compaction import compact
from framework.results.rows import REQUEST_COLUMNS
from framework.results.rows import trial_columns
from framework.results.store import ResultStore
from framework.results.store import arrow_schema

SWEEP = "scale"
QUERY = re.compile(r"```python\n# results-query: (\w+)\n(.*?)```", re.S)
SEQS = [2, 4, 8, 16, 32, 64, 128]


def queries() -> dict[str, str]:
    """{reader: code} of docs/RESULTS.md's worked queries, as tests/e2e/test_results_doc.py reads
    them."""
    return dict(QUERY.findall((ROOT / "docs" / "RESULTS.md").read_text()))


def trial_table(schema: pa.Schema, number: int, rng: np.random.Generator) -> pa.Table:
    row = {name: None for name in schema.names}
    seqs = SEQS[number % len(SEQS)]
    row.update({"trial_number": number, "state": "COMPLETE", "is_baseline": number == 0,
                "param_max_num_seqs": seqs, "param_max_num_batched_tokens": 2048,
                "param_enable_chunked_prefill": True, "param_enable_prefix_caching": True,
                "serve_command": f"vllm serve m --max-num-seqs {seqs}",
                "output_throughput": float(rng.uniform(100, 2000)),
                "p99_ttft_ms": float(rng.uniform(5, 500)), "p99_tpot_ms": float(rng.uniform(2, 40)),
                "kv_cache_usage_max": float(rng.uniform(0, 1)), "feasible": bool(number % 3),
                "completed": 0, "failed": 0})
    return pa.Table.from_pylist([row], schema=schema)


def request_table(schema: pa.Schema, number: int, n: int, rng: np.random.Generator) -> pa.Table:
    """n requests: latencies drawn, itl lists of 4 gaps, 2% failures."""
    ok = rng.random(n) >= 0.02
    ttft = rng.gamma(2.0, 20.0, n)
    tpot = rng.gamma(2.0, 5.0, n)
    out = rng.integers(16, 256, n)
    gaps = rng.gamma(2.0, 5.0, (n, 4))
    columns = {
        "trial_number": pa.array(np.full(n, number), pa.int64()),
        "step": pa.array(np.zeros(n, dtype=np.int64)),
        "request_index": pa.array(np.arange(n, dtype=np.int64)),
        "send_s": pa.array(np.sort(rng.uniform(0, 60, n))),
        "ttft_ms": pa.array(np.where(ok, ttft, np.nan), from_pandas=True),
        "tpot_ms": pa.array(np.where(ok, tpot, np.nan), from_pandas=True),
        "e2el_ms": pa.array(np.where(ok, ttft + tpot * (out - 1), np.nan), from_pandas=True),
        "itl_ms": pa.ListArray.from_arrays(pa.array(np.arange(0, 4 * n + 1, 4, dtype=np.int32)),
                                           pa.array(gaps.ravel())),
        "prompt_tokens": pa.array(rng.integers(64, 1024, n)),
        "output_tokens": pa.array(np.where(ok, out, 0)),
        "success": pa.array(ok),
    }
    arrays = [columns.get(f.name, pa.nulls(n, f.type)).cast(f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def make_sweep(root: Path, trials: int, requests: int) -> ResultStore:
    """The synthetic sweep under root/results, one file per trial and table."""
    space = load_search_space(ROOT / "search_spaces" / "tiny_cpu.yaml")
    trial_schema = arrow_schema(trial_columns(space, (50, 99)))
    request_schema = arrow_schema(REQUEST_COLUMNS)
    store = ResultStore(root / "results", SWEEP)
    store.trial_path(0).parent.mkdir(parents=True)
    store.requests_path(0).parent.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for n in range(trials):
        pq.write_table(trial_table(trial_schema, n, rng), store.trial_path(n))
        pq.write_table(request_table(request_schema, n, requests, rng), store.requests_path(n))
    return store


def timed(code: str, results: Path) -> float:
    """Seconds to run a documented query with RESULTS set to `results` (its output dropped)."""
    source = re.sub(r'^RESULTS = ".*"$', f'RESULTS = "{results}"', code, flags=re.M)
    source = source.replace("print(", "_ = (")
    start = time.perf_counter()
    exec(compile(source, "<query>", "exec"), {})  # the project's own doc, as its test runs it
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=10_000)
    p.add_argument("--requests", type=int, default=1_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-doc", action="store_true")
    args = p.parse_args()
    started, load = datetime.now(UTC), uptime()
    base = Path(tempfile.mkdtemp(prefix="vsweep-scale-"))
    try:
        t0 = time.perf_counter()
        store = make_sweep(base / "per-trial", args.trials, args.requests)
        made_s = time.perf_counter() - t0
        shutil.copytree(base / "per-trial", base / "compacted")
        t0 = time.perf_counter()
        done = compact(ResultStore(base / "compacted" / "results", SWEEP))
        compact_s = time.perf_counter() - t0
        copies = {"per-trial files": store.sweep_dir,
                  "compacted": base / "compacted" / "results" / SWEEP}
        sizes = {name: sum(f.stat().st_size for f in folder.rglob("*.parquet")) / 2**20
                 for name, folder in copies.items()}
        times: dict[tuple[str, str], list[float]] = {}
        for r in range(args.rounds):
            order = list(copies.items()) if r % 2 == 0 else list(reversed(copies.items()))
            for reader, code in queries().items():
                for name, folder in order:
                    times.setdefault((reader, name), []).append(timed(code, folder))
                    print(f"round {r}: {reader} on {name}: {times[(reader, name)][-1]:.2f} s",
                          flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    lines = ["| query (docs/RESULTS.md) | per-trial files: median s (min-max) | "
             "compacted: median s (min-max) |", "|---|---:|---:|"]
    for reader in queries():
        cells = []
        for name in copies:
            t = times[(reader, name)]
            cells.append(f"{statistics.median(t):.2f} ({min(t):.2f}-{max(t):.2f})")
        lines.append(f"| results-query: {reader} | {cells[0]} | {cells[1]} |")
    parts = ", ".join(f"{c.table}: {c.files} files -> {c.parts} part(s)" for c in done)
    text = "\n".join(lines) + (
        f"\n\n{args.trials:,} trials x {args.requests:,} requests ({args.trials * args.requests:,} "
        f"request rows): made in {made_s:.0f} s; Parquet {sizes['per-trial files']:.0f} MiB as "
        f"per-trial files, {sizes['compacted']:.0f} MiB compacted ({parts}; `compact` took "
        f"{compact_s:.0f} s). {args.rounds} rounds, the copies alternated. Load at start: {load}.")
    print(text)
    if not args.no_doc:
        append_section("Results at scale: the documented queries before and after `compact` "
                       "(issue #35 item 4)",
                       f"`python -m benchmarks.results_scale --trials {args.trials} --requests "
                       f"{args.requests} --rounds {args.rounds}`.", text, started)


if __name__ == "__main__":
    main()
