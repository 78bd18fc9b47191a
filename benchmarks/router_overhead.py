"""What the replicas shape's router (framework/engine/router.py) costs a measurement: one real
vLLM CPU server measured bare and through the router with it as the only backend (a replicas
trial of 1), the two alternated in random order within each pair, on the same running server.

    .venv/bin/python benchmarks/router_overhead.py [--pairs 6] [--no-doc]

Each run is `vllm-sweep bench` (the project's load generator, a child process) with one load:
--num-prompts requests of the quickstart's shape (128 in, 64 out, --max-concurrency 16). Per
pair, the router's value / the bare server's - 1 of output throughput, mean TTFT and median
TPOT; their median with a distribution-free 95% interval (benchmarks/paired.py). The router is
started as a trial starts it (framework.trial.replicas.start_router), on this machine's two
cores beside the server, so its CPU is in what it costs here.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC
from datetime import datetime
from pathlib import Path

try:
    from paired import median_ci
    from record import ROOT
    from record import append_section
    from record import uptime
except ModuleNotFoundError:  # imported as benchmarks.router_overhead
    from benchmarks.paired import median_ci
    from benchmarks.record import ROOT
    from benchmarks.record import append_section
    from benchmarks.record import uptime
from framework.cluster.ports import pick_port
from framework.load.http_client import get_sync
from framework.trial.replicas import start_router

MODEL = ROOT / "models" / "tiny-llama"
SERVE = "import sys; from framework.engine.vllm_server import serve; serve(sys.argv[1:])"
READY_S = 600.0
KEYS = ("output_throughput", "mean_ttft_ms", "median_tpot_ms")


def start_server(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A vLLM CPU server of the tiny model in its own session, once its /health answers."""
    port = pick_port("127.0.0.1", [])
    argv = ["--model", str(MODEL), "--host", "127.0.0.1", "--port", str(port),
            "--enforce-eager", "--max-model-len", "512"]
    with open(folder / "server.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-c", SERVE, *argv], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if get_sync(url + "/health", 5.0).status == 200:
                return proc, url
        except OSError:
            pass
        time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit(f"the server did not get ready: {(folder / 'server.log').read_text()[-2000:]}")


def bench(url: str, folder: Path, name: str, prompts: int) -> dict[str, float]:
    out = folder / f"{name}.json"
    argv = [str(ROOT / ".venv" / "bin" / "vllm-sweep"), "bench", "--base-url", url,
            "--model", str(MODEL), "--num-prompts", str(prompts), "--input-len", "128",
            "--output-len", "64", "--max-concurrency", "16", "--num-warmups", "8",
            "--ignore-eos", "--seed", "0", "--disable-tqdm", "--result-json", str(out)]
    subprocess.run(argv, check=True, capture_output=True, timeout=900)
    result = json.loads(out.read_text())
    return {k: float(result[k]) for k in KEYS}


def _loop() -> str:
    """The event loop the router runs on (framework/engine/router.py main)."""
    try:
        import uvloop
    except ImportError:
        return "asyncio's"
    return f"uvloop {uvloop.__version__}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-doc", action="store_true")
    args = parser.parse_args()
    started, load = datetime.now(UTC), uptime()
    folder = Path(tempfile.mkdtemp(prefix="vsweep-router-bench-"))
    server, bare = start_server(folder)
    router, routed = start_router("127.0.0.1", [bare], "round_robin", folder / "router.log")
    rows: list[dict[str, object]] = []
    try:
        order = random.Random(args.seed)
        for pair in range(args.pairs):
            variants = [("bare", bare), ("router", routed)]
            order.shuffle(variants)
            for name, url in variants:
                rows.append({"pair": pair, "variant": name,
                             **bench(url, folder, f"{pair}-{name}", args.prompts)})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        router.terminate()
        router.wait(timeout=30)
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        shutil.rmtree(folder, ignore_errors=True)
    lines = ["| pair | variant | " + " | ".join(KEYS) + " |", "|---|---|" + "---|" * len(KEYS)]
    lines += [f"| {r['pair']} | {r['variant']} | "
              + " | ".join(f"{float(r[k]):.2f}" for k in KEYS) + " |" for r in rows]  # type: ignore[arg-type]
    lines.append("")
    for key in KEYS:
        diffs = []
        for pair in range(args.pairs):
            value = {r["variant"]: float(r[key]) for r in rows if r["pair"] == pair}  # type: ignore[arg-type]
            diffs.append(value["router"] / value["bare"] - 1)
        med, low, high = median_ci(diffs)
        lines.append(f"- {key}: router / bare - 1, median {med:+.1%} (95% {low:+.1%} to "
                     f"{high:+.1%}; pairs: {', '.join(f'{d:+.1%}' for d in diffs)})")
    text = "\n".join(lines)
    print(text)
    if not args.no_doc:
        append_section("The replicas router's overhead (issue #36): one server bare vs behind "
                       "the router", f"`.venv/bin/python benchmarks/router_overhead.py --pairs "
                       f"{args.pairs}`, {args.prompts} requests per run; the router's event "
                       f"loop: {_loop()}. Load at start: {load}.",
                       text, started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
