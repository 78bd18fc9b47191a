"""Issue #17 item 6's acceptance: the quality probe fails fp8 KV cache against its threshold and
passes an output-preserving change, through the real runner (ask -> trial -> probe -> row ->
tell) on real vLLM CPU servers of the tiny model, with real Parquet. Three servers in all,
one at a time: the baseline (vLLM's defaults), `--kv-cache-dtype fp8`, `--max-num-seqs 4`
(marked `lossy: true` in this test's space so that it is probed: the probe must pass it).

The runner runs in this process with the real RayLauncher on the session's shared Ray, warm
start on (one zygote, three forked servers), so that the three trials can be enqueued by hand.
"""

from __future__ import annotations

import io
import signal
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from framework.cluster import RayLauncher
from framework.cluster import RaySession
from framework.results.html_report import render_report
from framework.sweep.loader import load
from framework.sweep.loader import server_env
from framework.sweep.runner import Runner
from tests.helpers import NO_REMEASURE
from tests.helpers import SharedRay
from tests.helpers import join_shared
from tests.helpers import wait_no_trial_processes


def write_sweep(tmp: Path, model: Path, ray: SharedRay) -> Path:
    space = tmp / "space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        "max-num-seqs": {"type": "categorical", "choices": [4, 128], "default": 128,
                         "lossy": True},
        "kv-cache-dtype": {"type": "categorical", "choices": ["auto", "fp8"], "default": "auto"},
    }}))
    sweep = tmp / "sweep.yaml"
    sweep.write_text(yaml.safe_dump(join_shared({
        "name": "quality", "model": str(model), "search_space": str(space), "engine": "cpu",
        "server": {"args": {"enforce-eager": True, "max-model-len": 512}, "reuse": False,
                   "startup_timeout_s": 240},
        "workload": {"num_prompts": 16, "input_len": 32, "output_len": 8, "warmup_requests": 2,
                     "max_concurrency": 4, "seed": 0},
        "sla": {"min_token_agreement": 0.95},
        "search": {**NO_REMEASURE, "sampler": "random", "n_trials": 3, "seed": 0},
        "results_dir": str(tmp / "results")}, ray)))
    return sweep


@pytest.mark.timeout(900)
def test_the_probe_fails_fp8_kv_cache_and_passes_a_max_num_seqs_change(shared_ray, tiny_model,
                                                                        short_tmp, monkeypatch):
    sweep = load(write_sweep(short_tmp, tiny_model, shared_ray), check_flags=False)
    out = io.StringIO()
    monkeypatch.setenv("RAY_TMPDIR", str(shared_ray.folder))
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    sigterm = signal.getsignal(signal.SIGTERM)  # ray.init installs its own handler here
    with RaySession(shared_ray.address):
        launcher = RayLauncher(env=server_env(sweep.spec), host="node", engine="cpu",
                               warm_start=True)
        runner = Runner(sweep, launcher, Console(file=out, width=200))
        runner.tuner.enqueue_baseline(sweep.space.defaults())
        runner.tuner.enqueue_new([{"max-num-seqs": 128, "kv-cache-dtype": "fp8"},
                                  {"max-num-seqs": 4, "kv-cache-dtype": "auto"}])
        try:
            runner.run(3)
        finally:
            launcher.stop_all()
            launcher.close()
    signal.signal(signal.SIGTERM, sigterm)
    assert wait_no_trial_processes(shared_ray.marker) == [], out.getvalue()[-3000:]

    trials = sweep.store.read_trials().set_index("trial_number")
    assert list(trials["state"]) == ["COMPLETE"] * 3, trials[["fail_reason", "fail_detail"]]
    assert trials["server_pid"].nunique() == 3 and not trials["server_reused"].any()
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
