"""The quality probe on the tiny model: does fp8 KV cache change greedy outputs, by how much
compared with batching noise, and does a max-num-seqs change leave them alone?

    .venv/bin/python benchmarks/quality_probe.py [--rounds 3] [--no-doc]

Each round starts three `vllm serve models/tiny-llama --enforce-eager --max-model-len 1024`
servers, one at a time: the baseline (vLLM's defaults), `--kv-cache-dtype fp8`, and
`--max-num-seqs 4`. Each server answers the sweep's probe set (framework.load.probe: 16 random
prompts of 64 tokens, 32 greedy tokens each, logprobs) twice at concurrency 8 and once at
concurrency 1. Compared (framework.trial.quality: token agreement up to the first differing
token, logprob MAD over the shared prefix):
- baseline self: the baseline's concurrency-1 run against its first concurrency-8 run (what
  the sweep stores as the noise floor), and its second concurrency-8 run against the first;
- each server's first concurrency-8 run against the baseline's of the same round (what a
  trial's row holds), and the baseline's against the first round's (a fresh server);
- probe lengths: the same comparisons cut to the first 8 and 16 generated tokens, to show
  how the agreement depends on `max_tokens`.
The table gives the mean and the min-max over the rounds. Appends to docs/BENCHMARKS.md unless
--no-doc.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC
from datetime import datetime
from pathlib import Path

from loadgen_parity import MODEL
from loadgen_parity import VllmServer
from record import append_section
from record import uptime

from framework.load.probe import ProbeAnswer
from framework.load.probe import ProbeSettings
from framework.load.probe import probe_prompts
from framework.load.probe import send_probe
from framework.load.workload import load_tokenizer
from framework.trial.quality import compare

SERVERS = [("baseline", ()), ("fp8", ("--kv-cache-dtype", "fp8")),
           ("max-num-seqs 4", ("--max-num-seqs", "4"))]
RUNS = [("c8", 8), ("c8 again", 8), ("c1", 1)]


def cut(answers: Sequence[ProbeAnswer], n: int) -> list[ProbeAnswer]:
    return [ProbeAnswer(a.token_ids[:n], a.logprobs[:n]) for a in answers]


def spread(values: list[float | None], spec: str) -> str:
    found = [v for v in values if v is not None]
    if not found:
        return "-"
    if len(found) < len(values):
        return f"{statistics.mean(found):{spec}} ({len(found)} of {len(values)})"
    return f"{statistics.mean(found):{spec}} [{min(found):{spec}}, {max(found):{spec}}]"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-doc", action="store_true")
    args = p.parse_args()
    settings = ProbeSettings()
    prompts = probe_prompts(load_tokenizer(MODEL), settings)
    work = Path(tempfile.mkdtemp(prefix="qp-", dir="/tmp"))
    load_before, started = uptime(), datetime.now(UTC)
    answers: list[dict[str, dict[str, tuple[ProbeAnswer, ...]]]] = []
    for r in range(args.rounds):
        answers.append({})
        for name, extra in SERVERS:
            t0 = time.monotonic()
            with VllmServer(MODEL, work / f"{r}-{name.replace(' ', '')}.log", extra,
                            startup_timeout_s=300) as server:
                ready = time.monotonic() - t0
                for label, concurrency in RUNS:
                    answers[r][f"{name} {label}"] = asyncio.run(send_probe(
                        server.base_url, str(MODEL), prompts, settings.max_tokens, concurrency,
                        settings.timeout_s))
            print(f"round {r}: {name} ready in {ready:.0f} s, probed", flush=True)
    pairs = [("baseline self: c1 vs c8 (the stored noise floor)", "baseline c8", "baseline c1", 0),
             ("baseline self: c8 vs c8", "baseline c8", "baseline c8 again", 0),
             ("baseline, fresh server vs round 0's", "baseline c8", "baseline c8", "first"),
             ("fp8 KV cache vs baseline", "baseline c8", "fp8 c8", 0),
             ("fp8 self: c1 vs c8", "fp8 c8", "fp8 c1", 0),
             ("max-num-seqs 4 vs baseline", "baseline c8", "max-num-seqs 4 c8", 0),
             ("max-num-seqs 4 self: c1 vs c8", "max-num-seqs 4 c8", "max-num-seqs 4 c1", 0)]
    lines = ["| comparison | token agreement (32 tokens) | logprob MAD, nats | agreement, first 16 "
             "| agreement, first 8 |", "| --- | ---: | ---: | ---: | ---: |"]
    for label, ref_key, other_key, which in pairs:
        rounds = range(1, args.rounds) if which == "first" else range(args.rounds)
        cells = {"agree": [], "mad": [], "16": [], "8": []}
        for r in rounds:
            ref = answers[0 if which == "first" else r][ref_key]
            other = answers[r][other_key]
            full = compare(ref, other)
            cells["agree"].append(full.token_agreement)
            cells["mad"].append(full.logprob_mad)
            cells["16"].append(compare(cut(ref, 16), cut(other, 16)).token_agreement)
            cells["8"].append(compare(cut(ref, 8), cut(other, 8)).token_agreement)
        lines.append(f"| {label} | {spread(cells['agree'], '.3f')} | {spread(cells['mad'], '.4f')}"
                     f" | {spread(cells['16'], '.3f')} | {spread(cells['8'], '.3f')} |")
    table = "\n".join(lines)
    print(table)
    if not args.no_doc:
        append_section(
            "Quality probe on the tiny model (issue #17 item 6)",
            f"Command: `.venv/bin/python benchmarks/quality_probe.py --rounds {args.rounds}` "
            f"({args.rounds} rounds of three fresh servers, `vllm serve models/tiny-llama "
            "--enforce-eager --max-model-len 1024` plus the flags named, one at a time; the "
            "sweep's probe set: 16 random prompts of 64 tokens, 32 greedy tokens each, "
            "`logprobs: 1`, sent at concurrency 8 twice and at 1 once per server). Each cell: "
            "the mean over the rounds [min, max] (the fresh-server row: rounds 1.. against "
            f"round 0).\n\nMachine load: before `{load_before}`; after `{uptime()}`.",
            table, started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
