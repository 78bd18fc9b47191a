"""Parity benchmark: `vllm bench serve` vs `vllm-sweep bench` against ONE vLLM CPU server.

    .venv/bin/python benchmarks/loadgen_parity.py [--runs 3] [--num-prompts 300] [--no-doc]

Starts one `vllm serve` of the tiny model (--enforce-eager --max-model-len 1024), warms it up,
then alternates the two clients `--runs` times with the same random workload (300 prompts,
256 tokens in, 64 out, --max-concurrency 16, --ignore-eos, --temperature 0 for both) and
prints, per client, the median over runs of: median TTFT, median TPOT, median ITL, output
throughput, and CPU seconds per 1000 output tokens for the whole client process and for the
benchmark phase.
Appends the tables, the command, the date and the machine load to docs/BENCHMARKS.md.

CPU accounting:
- whole process: user + sys of the finished client from resource.getrusage(RUSAGE_CHILDREN)
  deltas around each run (children are run one at a time and waited for);
- benchmark phase, reported by each tool: ours writes ``benchmark_phase_cpu_s`` (process CPU
  over the measured run and its metrics); vllm bench is run through a 10-line wrapper that
  calls vLLM's own CLI entry point after wrapping ``vllm.benchmarks.serve.benchmark`` with
  time.process_time() (same imports and code path as `vllm bench serve`);
- benchmark phase, by subtraction (the same method for both tools): whole process minus the
  median whole-process CPU of a start-up-only run (`vllm bench serve --help`, resp.
  `vllm-sweep bench --help`);
- the issue's estimate for vllm bench: whole process minus an import-only run
  (`python -c "import vllm.benchmarks.serve"`), compared with ours as reported. It counts
  vllm bench's CLI set-up, tokenizer loading and prompt generation as benchmark phase, so it
  is the most favourable to us; the verdicts list all three.

The server is stopped in a finally: SIGTERM to its PID, then SIGKILL to its process group
(its own session) if anything is left. Nothing is stopped by name.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC
from datetime import datetime
from pathlib import Path
from typing import Any

try:
    from record import ROOT
    from record import append_section
    from record import uptime
except ModuleNotFoundError:  # imported as benchmarks.loadgen_parity (tests/{unit,e2e}/test_bench.py)
    from benchmarks.record import ROOT
    from benchmarks.record import append_section
    from benchmarks.record import uptime
from framework.cluster.ports import pick_port

BIN = Path(sys.executable).parent
MODEL = ROOT / "models" / "tiny-llama"
SERVER_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CACHE_ROOT": str(ROOT / ".cache" / "vllm"),
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
}
VLLM_BENCH_TIMED = """
import sys, time
import vllm.benchmarks.serve as serve
inner = serve.benchmark
async def timed(*args, **kwargs):
    start = time.process_time()
    try:
        return await inner(*args, **kwargs)
    finally:
        print(f"BENCHMARK_PHASE_CPU_S={time.process_time() - start}", flush=True)
serve.benchmark = timed
from vllm.entrypoints.cli.main import main
sys.argv = ["vllm", "bench", "serve", *sys.argv[1:]]
main()
"""


class VllmServer:
    """`vllm serve MODEL --enforce-eager --max-model-len 1024 [extra]` on a free local port, in
    its own session; a context manager that waits for /health and always stops the server.
    `eager=False` drops --enforce-eager (torch.compile runs); `env` overrides SERVER_ENV;
    `cpus`: the CPUs the server and every process and thread it starts may run on (its
    affinity, inherited; vLLM's CPU backend binds its OpenMP threads within it)."""

    def __init__(self, model: Path, log_path: Path, extra_args: tuple[str, ...] = (),
                 startup_timeout_s: float = 300.0, eager: bool = True,
                 env: dict[str, str] | None = None,
                 cpus: frozenset[int] | None = None) -> None:
        self.port = pick_port("127.0.0.1", [])
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.argv = [str(BIN / "vllm"), "serve", str(model), *(["--enforce-eager"] * eager),
                     "--max-model-len", "1024", "--host", "127.0.0.1", "--port", str(self.port),
                     *extra_args]
        self.env = {**os.environ, **SERVER_ENV, **(env or {})}
        self.log_path, self.startup_timeout_s = log_path, startup_timeout_s
        self.proc: subprocess.Popen | None = None
        self.cpus = cpus

    def __enter__(self) -> VllmServer:
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=placement(None, self.cpus))
        log.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}:\n{tail}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"vllm serve not ready within {self.startup_timeout_s:.0f} s")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        """SIGTERM the API server (it stops its engine processes), then SIGKILL its group."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: only its processes
        except ProcessLookupError:
            pass
        self.proc.wait()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def placement(nice: int | None, cpus: frozenset[int] | None) -> Callable[[], None] | None:
    """A child's preexec_fn setting its absolute niceness and its CPU affinity (each only if
    given; None if neither is)."""
    if nice is None and cpus is None:
        return None

    def _place() -> None:
        if nice is not None:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    return _place


def run_timed(argv: list[str], timeout_s: float = 600.0, nice: int | None = None,
              cpus: frozenset[int] | None = None) -> tuple[str, float]:
    """Run a client to completion; its stdout and its whole-process CPU seconds. `nice`: the
    client's absolute niceness (e.g. -10: ahead of the server it shares the cores with, as a
    client on its own machine would be); `cpus`: its CPU affinity (e.g. a core the server
    may not use)."""
    before = children_cpu_s()
    proc = subprocess.run(argv, env={**os.environ, **SERVER_ENV}, capture_output=True,
                          text=True, timeout=timeout_s, cwd=ROOT, preexec_fn=placement(nice, cpus))
    cpu = children_cpu_s() - before
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:3]} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n"
                           f"{proc.stderr[-3000:]}")
    return proc.stdout, cpu


def workload_args(args: argparse.Namespace) -> list[str]:
    return ["--model", str(MODEL), "--dataset-name", "random",
            "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
            "--num-prompts", str(args.num_prompts), "--max-concurrency", str(args.max_concurrency),
            "--ignore-eos", "--seed", "0", "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,99", "--temperature", "0"]  # greedy, both clients


def run_vllm_bench(url: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    stdout, cpu = run_timed([sys.executable, "-c", VLLM_BENCH_TIMED, "--backend", "openai",
                             "--base-url", url, *workload_args(args), "--save-result",
                             "--result-dir", str(out.parent), "--result-filename", out.name,
                             "--disable-tqdm"])
    phase = next(float(line.split("=", 1)[1]) for line in stdout.splitlines()
                 if line.startswith("BENCHMARK_PHASE_CPU_S="))
    return checked({**json.loads(out.read_text()), "whole_cpu_s": cpu, "phase_cpu_s": phase},
                   args)


def run_ours(url: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    _, cpu = run_timed([str(BIN / "vllm-sweep"), "bench", "--base-url", url,
                        *workload_args(args), "--result-json", str(out)])
    result = json.loads(out.read_text())
    return checked({**result, "whole_cpu_s": cpu, "phase_cpu_s": result["benchmark_phase_cpu_s"]},
                   args)


def checked(result: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The result, if every request succeeded (vllm bench exits 0 even when all failed)."""
    if (result["completed"], result["failed"]) != (args.num_prompts, 0):
        raise RuntimeError(f"{result['completed']} of {args.num_prompts} requests succeeded "
                           f"({result['failed']} failed)")
    return result


def startup_cpu_s(argv: list[str], repeats: int) -> float:
    return statistics.median(run_timed(argv)[1] for _ in range(repeats))


def sampler_cost(base_url: str, server_pid: int, scrapes: int = 40) -> dict[str, float]:
    """Client CPU per scrape (sampler thread) and the API server's CPU per scrape (psutil,
    idle CPU of the same span subtracted), against the idle server."""
    import psutil

    from framework.engine.server_metrics import MetricsSampler

    proc = psutil.Process(server_pid)

    def server_cpu() -> float:
        times = proc.cpu_times()
        return times.user + times.system

    idle0, t0 = server_cpu(), time.monotonic()
    time.sleep(3.0)
    idle_rate = (server_cpu() - idle0) / (time.monotonic() - t0)
    cpu0, t0 = server_cpu(), time.monotonic()
    sampler = MetricsSampler(base_url, interval_s=0.05).start()
    while len(sampler.result.samples) < scrapes:
        time.sleep(0.05)
    result = sampler.stop()
    span = time.monotonic() - t0
    n = len(result.samples) + result.errors
    return {"scrapes": n, "client_ms": 1000 * result.cpu_s / n,
            "server_ms": 1000 * (server_cpu() - cpu0 - idle_rate * span) / n}


def med(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(row[key] for row in rows)


def per_1000(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(1000 * row[key] / row["total_output_tokens"] for row in rows)


def tables(results: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = ["| client | median TTFT ms | median TPOT ms | median ITL ms | output tok/s | "
             "CPU-s per run (whole) | CPU-s/1000 tok, whole | CPU-s/1000 tok, phase (reported) | "
             "CPU-s/1000 tok, phase (whole - start-up) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, rows in results.items():
        lines.append(
            f"| {name} | {med(rows, 'median_ttft_ms'):.1f} | {med(rows, 'median_tpot_ms'):.2f} | "
            f"{med(rows, 'median_itl_ms'):.2f} | {med(rows, 'output_throughput'):.0f} | "
            f"{med(rows, 'whole_cpu_s'):.2f} | {per_1000(rows, 'whole_cpu_s'):.3f} | "
            f"{per_1000(rows, 'phase_cpu_s'):.4f} | {per_1000(rows, 'phase_sub_cpu_s'):.4f} |")
    lines += ["", "Per run (alternating, in order):", "",
              "| run | client | median TTFT ms | median TPOT ms | median ITL ms | output tok/s | "
              "whole CPU-s | phase CPU-s (reported) |",
              "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    names = list(results)
    for i in range(len(results[names[0]])):
        for name in names:
            row = results[name][i]
            lines.append(f"| {i + 1} | {name} | {row['median_ttft_ms']:.1f} | "
                         f"{row['median_tpot_ms']:.2f} | {row['median_itl_ms']:.2f} | "
                         f"{row['output_throughput']:.0f} | {row['whole_cpu_s']:.2f} | "
                         f"{row['phase_cpu_s']:.3f} |")
    return lines


def verdicts(vllm: list[dict[str, Any]], ours: list[dict[str, Any]]) -> list[str]:
    """One line per target of the issue: met or missed, and by how much."""
    out = []
    for key, label, limit in (("median_ttft_ms", "median TTFT", 0.10),
                              ("median_tpot_ms", "median TPOT", 0.10),
                              ("median_itl_ms", "median ITL", 0.10),
                              ("output_throughput", "output throughput", 0.05)):
        theirs, mine = med(vllm, key), med(ours, key)
        diff = (mine - theirs) / theirs if theirs else float("inf")
        missed = 100 * (abs(diff) - limit)
        status = "met" if abs(diff) <= limit else f"MISSED by {missed:.1f} points"
        out.append(f"- {label}: ours {mine:.3g} vs vllm bench {theirs:.3g}: {100 * diff:+.1f}% "
                   f"(target within {100 * limit:.0f}%): {status}")
    phase = "benchmark-phase CPU per 1000 tokens"
    for key, label, limit in (
            ("phase_cpu_s", f"{phase}, both as reported by the tools", 0.5),
            ("phase_sub_cpu_s", f"{phase}, both as whole - start-up-only run", 0.5),
            ("phase_issue_cpu_s", f"{phase}, ours reported vs vllm bench's whole - "
             "`import vllm.benchmarks.serve` (the issue's method)", 0.5)):
        mine, theirs = per_1000(ours, key), per_1000(vllm, key)
        if mine <= 0 or theirs <= 0:
            out.append(f"- {label}: not measurable this time (a subtraction went negative: "
                       f"ours {mine:.4f}, vllm bench {theirs:.4f} CPU-s per 1000 tokens)")
            continue
        ratio = mine / theirs
        status = "met" if ratio <= limit else f"MISSED ({ratio:.2f}x)"
        out.append(f"- {label}: {ratio:.2f}x vllm bench's (target <= {limit}x): {status}")
    ratio = med(ours, "whole_cpu_s") / med(vllm, "whole_cpu_s")
    out.append(f"- whole-process CPU per run: {ratio:.3f}x vllm bench's (target <= 0.2x): "
               f"{'met' if ratio <= 0.2 else f'MISSED ({ratio:.2f}x)'}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=300)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--max-concurrency", type=int, default=16)
    parser.add_argument("--no-doc", action="store_true", help="print only; leave BENCHMARKS.md")
    args = parser.parse_args()
    command = "benchmarks/loadgen_parity.py " + " ".join(sys.argv[1:])
    started = datetime.now(UTC)
    load_before = uptime()
    results: dict[str, list[dict[str, Any]]] = {"vllm bench serve": [], "vllm-sweep bench": []}
    with tempfile.TemporaryDirectory(prefix="parity-") as tmp:
        out = Path(tmp)
        with VllmServer(MODEL, out / "server.log") as server:
            print(f"server ready at {server.base_url} (pid {server.pid}); warming up", flush=True)
            warm = argparse.Namespace(**{**vars(args), "num_prompts": 100})
            run_ours(server.base_url, warm, out / "warmup.json")
            cost = sampler_cost(server.base_url, server.pid)
            for i in range(args.runs):
                results["vllm bench serve"].append(
                    run_vllm_bench(server.base_url, args, out / f"vllm-{i}.json"))
                results["vllm-sweep bench"].append(
                    run_ours(server.base_url, args, out / f"ours-{i}.json"))
                print(f"run {i + 1}/{args.runs} done", flush=True)
        startup = {"vllm": startup_cpu_s([str(BIN / "vllm"), "bench", "serve", "--help"], 2),
                   "ours": startup_cpu_s([str(BIN / "vllm-sweep"), "bench", "--help"], 3)}
        import_only = startup_cpu_s([sys.executable, "-c", "import vllm.benchmarks.serve"], 2)
    for name, tool in (("vllm bench serve", "vllm"), ("vllm-sweep bench", "ours")):
        for row in results[name]:
            row["phase_sub_cpu_s"] = row["whole_cpu_s"] - startup[tool]
            # the estimate for vllm bench: whole - import-only; ours: as reported
            row["phase_issue_cpu_s"] = (row["whole_cpu_s"] - import_only if tool == "vllm"
                                        else row["phase_cpu_s"])
    load_after = uptime()
    preamble = (
        f"Command: `.venv/bin/python {command.strip()}` ({args.runs} alternating runs per "
        f"client; {args.num_prompts} random prompts, {args.input_len} in / {args.output_len} "
        f"out, --max-concurrency {args.max_concurrency}, --ignore-eos, --temperature 0; one "
        "`vllm serve models/tiny-llama --enforce-eager --max-model-len 1024`, "
        "VLLM_CPU_KVCACHE_SPACE=1). Values are medians over the runs.\n\n"
        f"Machine load: before `{load_before}`; after `{load_after}`.")
    section = [
        *tables(results), "",
        f"Start-up only (median whole-process CPU-s): `vllm bench serve --help` "
        f"{startup['vllm']:.2f}, `python -c \"import vllm.benchmarks.serve\"` {import_only:.2f}, "
        f"`vllm-sweep bench --help` {startup['ours']:.2f}.", "",
        f"/metrics sampler ({cost['scrapes']} scrapes of the idle server): "
        f"{cost['client_ms']:.2f} ms client CPU and {cost['server_ms']:.2f} ms API-server CPU "
        "per scrape (at one scrape per 0.5 s: "
        f"{cost['client_ms'] / 5:.2f}% and {cost['server_ms'] / 5:.2f}% of one core).", "",
        "Targets:", "", *verdicts(results["vllm bench serve"], results["vllm-sweep bench"]), "",
    ]
    text = "\n".join(section)
    print(preamble + "\n\n" + text)
    if not args.no_doc:
        append_section("Load generator parity", preamble, text, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
