"""How long one prediction takes (engine/prediction.py), with and without the fast-forward of
pure-decode runs (engine/sim_run.py `simulate(fast_forward=...)`), alternated in one run.

    .venv/bin/python benchmarks/prediction_speed.py [--rounds 5] [--no-doc]

Deployment: Llama-3.1-70B's architecture (model_configs/deepseek-r1-distill-llama-70b) on
H100-80GB through AIConfigurator's predictor (the `predict` extra), at TP 4 and TP 8, default
batch limits; load: 256 prompts of 2048 + 256 tokens at concurrency 64. Each round predicts
both deployments once per variant, the variants in alternating order; the predictor's compile
(once per process) is done before the first round. Reports per variant the median (min-max)
seconds per prediction over rounds, and checks both variants predicted the same metrics.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from record import append_section
from record import uptime

from framework.engine import prediction
from framework.engine.predictor import Deployment
from framework.engine.predictor import predictor
from framework.engine.sim_run import simulate

MODEL = Path(__file__).resolve().parents[1] / "model_configs" / "deepseek-r1-distill-llama-70b"
LOAD = prediction.PredictedLoad(input_len=2048, output_len=256, num_prompts=256, max_concurrency=64)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args(argv)
    started, load_line = datetime.now(UTC), uptime()
    model = predictor("aiconfigurator")
    if model.unavailable():
        print(model.unavailable(), file=sys.stderr)
        return 2
    deployments = [Deployment(model=MODEL, gpu="H100-80GB", tensor_parallel=tp) for tp in (4, 8)]
    for d in deployments:  # compile and memory once, outside the timing
        prediction.predict(model, d, LOAD)
    seconds: dict[bool, list[float]] = {True: [], False: []}
    results: dict[bool, list[dict]] = {True: [], False: []}

    def timed(fast: bool) -> None:
        original = prediction.simulate
        prediction.simulate = lambda *a, **k: simulate(*a, **k, fast_forward=fast)  # type: ignore[assignment]
        try:
            t0 = time.perf_counter()
            out = [dict(prediction.predict(model, d, LOAD).metrics) for d in deployments]
            seconds[fast].append((time.perf_counter() - t0) / len(deployments))
            results[fast].append({"out": out})
        finally:
            prediction.simulate = original  # type: ignore[assignment]

    for r in range(args.rounds):
        for fast in ((True, False) if r % 2 == 0 else (False, True)):
            timed(fast)
    same = all(a == b for a, b in zip(results[True], results[False], strict=True))
    lines = ["| variant | s per prediction, median (min-max) over rounds |", "|---|---|"]
    for fast, label in ((True, "fast-forward (default)"), (False, "step by step")):
        xs = seconds[fast]
        lines.append(f"| {label} | {statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f}) |")
    ratio = [s / f for s, f in zip(seconds[False], seconds[True], strict=True)]
    text = "\n".join(lines) + (f"\n\nStep by step / fast-forward, per round: median "
                               f"{statistics.median(ratio):.1f}x ({min(ratio):.1f}-{max(ratio):.1f}x); "
                               f"identical metrics in every round: {same}.")
    print(text)
    if not args.no_doc:
        append_section("Prediction speed: the decode fast-forward (issue #37)",
                       f"`.venv/bin/python benchmarks/prediction_speed.py --rounds {args.rounds}` "
                       f"({load_line}). TP 4 and TP 8 of a 70B on H100, 256 x (2048 + 256) tokens "
                       "at concurrency 64, variants alternated.", text, started)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
