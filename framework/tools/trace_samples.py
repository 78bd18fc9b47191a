"""Small synthetic traces for trying `dataset: timed_trace` (nothing downloaded).

    python -m framework.tools.trace_samples [OUT_DIR] [--num N] [--seed S]   # make samples

writes OUT_DIR/mooncake_sample.jsonl and OUT_DIR/azure_sample.csv (default: datasets/, where
the shipped copies are; the same arguments give the same bytes).

- ``mooncake_trace``: Mooncake's JSONL format (``timestamp`` in ms, ``input_length``,
  ``output_length``, ``hash_ids``) with blocks of BLOCK tokens (read it with
  chunk_hash_size BLOCK and sec_multiplier 0.001). Hash ids are global block numbers, as in
  Mooncake's traces, and prompts reuse them the way production traffic does: a third start
  with one of four shared system prompts (8-16 blocks, the first the most used), a third
  resend an earlier request's blocks plus a few new ones (a conversation going on), the rest
  are all new. Arrivals are Poisson at RATE with bursts (the first 4 s of every 40 s three
  times as busy), outputs log-normal.
- ``azure_csv``: Azure's LLM inference trace columns ``TIMESTAMP`` (a date-time with 7
  fractional digits, as Azure writes them), ``ContextTokens``, ``GeneratedTokens``.
Lengths stay within MAX_INPUT + MAX_OUTPUT tokens (the tiny model's servers use
max-model-len 1024). Imports nothing of the project.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from datetime import datetime
from datetime import timedelta
from pathlib import Path

import numpy as np

BLOCK = 16
MAX_INPUT = 720
MAX_OUTPUT = 128
RATE = 4.0  # requests/s at speed-up 1
PREFIX_BLOCKS = (8, 10, 12, 16)
PREFIX_WEIGHTS = (0.4, 0.3, 0.2, 0.1)
AZURE_START = datetime(2023, 11, 16, 18, 15, 46)


def _arrival_ms(rng: np.random.Generator, num: int) -> list[int]:
    """Poisson arrivals at RATE, three times as fast in the first 4 s of every 40 s; whole ms
    from 0, non-decreasing."""
    times, t = [], 0.0
    for _ in range(num):
        busy = int(t) % 40 < 4
        t += float(rng.exponential(1.0 / (RATE * (3.0 if busy else 1.0))))
        times.append(int(t * 1000))
    return times


def _output_len(rng: np.random.Generator) -> int:
    return int(np.clip(rng.lognormal(3.4, 0.6), 4, MAX_OUTPUT))


def mooncake_trace(num: int = 150, seed: int = 0) -> list[dict[str, object]]:
    """``num`` Mooncake-format rows (module docstring), reproducible from ``seed``."""
    rng = np.random.default_rng(seed)
    next_id = 0

    def new_blocks(n: int) -> list[int]:
        nonlocal next_id
        next_id += n
        return list(range(next_id - n, next_id))

    prefixes = [new_blocks(n) for n in PREFIX_BLOCKS]
    rows: list[dict[str, object]] = []
    for ts in _arrival_ms(rng, num):
        kind = rng.random()
        earlier = [r for r in rows if len(r["hash_ids"]) <= MAX_INPUT // BLOCK - 6]  # type: ignore[arg-type]
        if kind < 1 / 3:
            prefix = prefixes[int(rng.choice(len(prefixes), p=PREFIX_WEIGHTS))]
            ids = prefix + new_blocks(int(rng.integers(2, 20)))
        elif kind < 2 / 3 and earlier:
            before = earlier[int(rng.integers(max(0, len(earlier) - 20), len(earlier)))]
            ids = list(before["hash_ids"]) + new_blocks(int(rng.integers(1, 6)))  # type: ignore[call-overload]
        else:
            ids = new_blocks(int(rng.integers(2, 30)))
        ids = ids[:MAX_INPUT // BLOCK]
        length = len(ids) * BLOCK - int(rng.integers(0, BLOCK))
        rows.append({"timestamp": ts, "input_length": length, "output_length": _output_len(rng),
                     "hash_ids": ids})
    return rows


def azure_csv(num: int = 150, seed: int = 0) -> list[dict[str, object]]:
    """``num`` Azure-format rows (module docstring), reproducible from ``seed``."""
    rng = np.random.default_rng(seed + 1)
    rows = []
    for ms in _arrival_ms(rng, num):
        stamp = AZURE_START + timedelta(milliseconds=ms, microseconds=int(rng.integers(0, 1000)))
        rows.append({"TIMESTAMP": stamp.strftime("%Y-%m-%d %H:%M:%S.%f") + "0",
                     "ContextTokens": int(np.clip(rng.lognormal(5.3, 0.6), 16, MAX_INPUT)),
                     "GeneratedTokens": _output_len(rng)})
    return rows


def jsonl_text(rows: list[dict[str, object]]) -> str:
    return "".join(json.dumps(row, separators=(", ", ": ")) + "\n" for row in rows)


def csv_text(rows: list[dict[str, object]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def write_samples(out_dir: Path, num: int = 150, seed: int = 0) -> list[Path]:
    """Write both samples to ``out_dir``; their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    moon, azure = out_dir / "mooncake_sample.jsonl", out_dir / "azure_sample.csv"
    moon.write_text(jsonl_text(mooncake_trace(num, seed)))
    azure.write_text(csv_text(azure_csv(num, seed)))
    return [moon, azure]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m framework.tools.trace_samples",
                                description=__doc__.splitlines()[0])
    p.add_argument("out_dir", nargs="?", default="datasets")
    p.add_argument("--num", type=int, default=150, help="requests per trace (default 150)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.num < 1:
        print(f"error: --num: {args.num}: must be >= 1", file=sys.stderr)
        return 2
    for path in write_samples(Path(args.out_dir), args.num, args.seed):
        print(f"{path}: written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
