"""Issue #17 item 6's acceptance: the quality probe fails fp8 KV cache against its threshold and
passes an output-preserving change, through the real runner (ask -> trial -> probe -> row ->
tell) on real vLLM CPU servers of the tiny model, with real Parquet. Three servers in all,
one at a time: the baseline (vLLM's defaults), `--kv-cache-dtype fp8`, `--max-num-seqs 4`
(marked `lossy: true` in this test's space so that it is probed: the probe must pass it).

The servers run `framework.engine.vllm_server.serve` (what the Ray server actor runs) as local
processes, each in its own session, stopped by process group: this test is about the probe,
not about placement, and Ray's start-up would only add time.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from framework.base.errors import TrialError
from framework.cluster.ports import pick_port
from framework.results.html_report import render_report
from framework.sweep.loader import load
from framework.sweep.loader import server_env
from framework.sweep.runner import Runner
from tests.helpers import MARKER_VAR
from tests.helpers import NO_REMEASURE
from tests.helpers import ROOT
from tests.helpers import new_marker
from tests.helpers import wait_no_marked_processes

HOST = "127.0.0.1"
SERVE = "import sys; from framework.engine.vllm_server import serve; serve(sys.argv[1:])"
CACHE = Path(os.environ.get("VLLM_SWEEP_CACHE_DIR") or ROOT / ".cache")


class LocalServer:
    """trial.ServerHandle: one vLLM server process on 127.0.0.1 in its own session."""

    def __init__(self, argv: Sequence[str], port: int, log_path: Path, env: dict[str, str]) -> None:
        self.base_url, self.node_ip, self.placement = f"http://{HOST}:{port}", HOST, (HOST,)
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-c", SERVE, *argv], env=env,
                                         stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.pid = self.proc.pid

    def is_alive(self) -> bool:
        return self.proc.poll() is None

    def failure(self) -> TrialError | None:
        code = self.proc.poll()
        return None if code is None else TrialError("startup_crash", f"vLLM exited with {code}")

    def stop(self) -> list[int]:
        if self.proc.poll() is None:
            os.killpg(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.pid, signal.SIGKILL)  # vLLM's engine process, if it outlived the server
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        return []

    def command(self, name: str, timeout_s: float = 60.0) -> str:
        raise AssertionError("server.reuse is off in this test")

    def startup_log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")


class LocalLauncher:
    """runner.ClusterLauncher on this machine: one server at a time (the CPU engine's default)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env, self.servers = env, []

    def node_resources(self) -> list[dict[str, float]]:
        return [{"CPU": 2.0}]

    def free_devices(self) -> float:
        return 1.0

    def launch(self, argv_for_port: Callable[[str, int], list[str]], log_path: Path,
               wanted: Sequence[dict[str, float]], on_placed: Callable[[], None] = lambda: None,
               unit: int = 1) -> LocalServer:
        port = pick_port(HOST, [])
        server = LocalServer(argv_for_port(HOST, port), port, log_path, self.env)
        self.servers.append(server)
        on_placed()
        return server

    def stop_all(self) -> None:
        for server in self.servers:
            server.stop()


def write_sweep(tmp: Path, model: Path) -> Path:
    space = tmp / "space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        "max-num-seqs": {"type": "categorical", "choices": [4, 128], "default": 128,
                         "lossy": True},
        "kv-cache-dtype": {"type": "categorical", "choices": ["auto", "fp8"], "default": "auto"},
    }}))
    sweep = tmp / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "quality", "model": str(model), "search_space": str(space), "engine": "cpu",
        "server": {"args": {"enforce-eager": True, "max-model-len": 512}, "reuse": False,
                   "startup_timeout_s": 240},
        "workload": {"num_prompts": 16, "input_len": 32, "output_len": 8, "warmup_requests": 2,
                     "max_concurrency": 4, "seed": 0},
        "sla": {"min_token_agreement": 0.95},
        "search": {**NO_REMEASURE, "sampler": "random", "n_trials": 3, "seed": 0},
        "results_dir": str(tmp / "results")}))
    return sweep


@pytest.mark.timeout(900)
def test_the_probe_fails_fp8_kv_cache_and_passes_a_max_num_seqs_change(tiny_model, short_tmp):
    marker = new_marker()
    sweep = load(write_sweep(short_tmp, tiny_model), check_flags=False)
    env = {**os.environ, **server_env(sweep.spec), MARKER_VAR: marker,
           "VLLM_CACHE_ROOT": str(CACHE / "vllm"), "HF_HOME": str(CACHE / "hf"),
           "PYTHONPATH": str(ROOT)}
    launcher = LocalLauncher(env)
    out = io.StringIO()
    runner = Runner(sweep, launcher, Console(file=out, width=200))
    runner.tuner.enqueue_baseline(sweep.space.defaults())
    runner.tuner.enqueue_new([{"max-num-seqs": 128, "kv-cache-dtype": "fp8"},
                              {"max-num-seqs": 4, "kv-cache-dtype": "auto"}])
    started = time.monotonic()
    try:
        runner.run(3)
    finally:
        launcher.stop_all()
        left = wait_no_marked_processes(marker)
    took = time.monotonic() - started
    print(f"3 trials (3 vLLM servers, one at a time) in {took:.0f} s")
    assert left == [] and len(launcher.servers) == 3

    trials = sweep.store.read_trials().set_index("trial_number")
    assert list(trials["state"]) == ["COMPLETE"] * 3, trials[["fail_reason", "fail_detail"]]
    baseline, fp8, seqs = trials.loc[0], trials.loc[1], trials.loc[2]
    assert (fp8["param_kv_cache_dtype"], seqs["param_max_num_seqs"]) == ("fp8", 4)
    itself = baseline["quality_baseline_agreement"]
    assert baseline["token_agreement"] == itself and baseline["quality_ok"]
    for row in (fp8, seqs):  # judged against the baseline's own noise floor and the SLA
        assert row["quality_baseline_agreement"] == itself
        assert row["quality_required"] == pytest.approx(min(0.95, itself - 0.02))
        assert row["quality_ok"] == (row["token_agreement"] >= row["quality_required"])
    for number, row in trials.iterrows():
        print(f"trial {number}: start-up {row['startup_s']:.0f} s, load {row['bench_s']:.1f} s, "
              f"whole trial (probe included) {row['trial_s']:.0f} s")
    print(f"token agreement: baseline with itself {itself:.3f}, fp8 {fp8['token_agreement']:.3f}"
          f" (MAD {fp8['logprob_mad']:.4f} nats), max-num-seqs 4 {seqs['token_agreement']:.3f}")

    # fp8 KV cache changes the greedy outputs: the probe fails it, and so does the SLA
    assert fp8["quality_note"] == "changes kv-cache-dtype"
    assert not fp8["quality_ok"] and not fp8["feasible"]
    assert "min_token_agreement" in fp8["sla_violations"]
    # max-num-seqs 4 changes batching only: the probe passes it
    assert seqs["quality_note"] == "changes max-num-seqs"
    assert seqs["quality_ok"] and seqs["feasible"] and seqs["sla_violations"] == ""

    probes = sweep.store.read_probes()
    runs = {(r["trial_number"], r["run"], r["concurrency"]) for r in probes}
    assert runs == {(0, 0, 8), (0, 1, 1), (1, 0, 8), (2, 0, 8)}
    assert len(probes) == 4 * 16 and all(len(r["token_ids"]) == 32 for r in probes)

    page = render_report(sweep.store.read_trials(), sweep.spec, None,
                         short_tmp / "report.html").read_text()
    assert "<h2>Output quality</h2>" in page and "outputs changed" in page
    assert "min_token_agreement &gt;= 95%" in page
