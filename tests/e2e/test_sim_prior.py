"""Predicted, then measured (issue #37's acceptance), on the GPU-scale proving ground: a sweep
of Llama-3.1-70B (its config.json as AIConfigurator ships it) on an emulated cluster of 2 nodes
x 8 fake H200s, served by the simulated GPU engine (FakeEngine with FAKE_ENGINE_SIM: its step
times are AIConfigurator's x the truth's per-configuration error field, engine/sim_truth.py;
a FAKE, named so, under the real Ray placement), with `search.prior: aiconfigurator`:
- the trials after the baseline are the predicted top k, in the prior's order (computed here by
  the product's own sweep/prior.py on the same files);
- every measured row carries its prediction beside its measurement, and they differ (the truth
  is not the model);
- the report's "Predicted vs measured" section shows each metric's error;
- `validate` says the prior is on; with the extra's import blocked, it says it is off, and the
  same sweep without the simulated engine runs unchanged, its rows without predictions.
The bug class it guards: a prior that silently does nothing (never enqueued, enqueued behind
the search, or predicted for other flags than the trial ran), rows whose predicted columns are
null or copied from the measurement, and a missing extra that breaks a GPU sweep.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from tests.cli import cli_in_process
from tests.cli import cli_joined
from tests.clusters import emulated_cluster
from tests.sweeps import NO_REMEASURE
from tests.sweeps import read_trials

pytestmark = pytest.mark.server
aiconfigurator_core = pytest.importorskip("aiconfigurator_core")

TOP_K = 3
GPU = "H200-141GB"  # holds a 70B at TP 2: few placeholder workers a trial (each a Ray worker)
SIM = {"predictor": "aiconfigurator", "gpu": GPU, "error": 0.3, "seed": 1,
       "noise_cv": 0.02}


@pytest.fixture
def llama70b(tiny_model, short_tmp) -> Path:
    """A model folder: the shipped 70B config.json, and the tiny model's tokenizer (the load
    generator and the simulated engine count tokens with it; no weights: nothing loads them)."""
    folder = short_tmp / "llama70b"
    folder.mkdir()
    shipped = Path(aiconfigurator_core.__file__).parent / "model_configs"
    shutil.copy(shipped / "meta-llama--Meta-Llama-3.1-70B_config.json", folder / "config.json")
    shutil.copy(tiny_model / "tokenizer.json", folder / "tokenizer.json")
    return folder


def _sweep(folder: Path, model: Path, address: str, name: str, sim: bool) -> Path:
    """`sim`: the simulated engine and a baseline; else plain FakeEngine latencies, no baseline,
    3 trials at TP 2 (every trial measured, as few placeholder workers as a 70B allows)."""
    space = folder / f"{name}-space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        # vLLM's defaults are choices (the baseline's); TP 1 cannot hold a 70B's 141 GB on an
        # H200: the feasibility model rules it out before launch
        "tensor-parallel-size": {"type": "categorical", "choices": [1, 2, 4] if sim else [2],
                                 "default": 1 if sim else 2},
        "max-num-seqs": {"type": "categorical", "choices": [4, 32, 1024], "default": 1024},
        "kv-cache-dtype": {"type": "categorical", "choices": ["auto", "fp8"], "default": "auto"},
    }}, sort_keys=False))
    env = {"FAKE_ENGINE_STARTUP_S": "0"}
    if sim:
        env["FAKE_ENGINE_SIM"] = json.dumps(SIM)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name, "model": str(model), "search_space": str(space), "engine": "fake",
        "gpu": GPU,
        "server": {"host": "node", "env": env},
        "workload": {"dataset": "random", "num_prompts": 16, "input_len": 256, "output_len": 32,
                     "max_concurrency": 8, "warmup_requests": 0, "request_timeout_s": 120},
        "objective": {"metric": "output_throughput_per_gpu", "direction": "maximize"},
        "sla": {"p99_tpot_ms": 1000},
        # the baseline (vLLM's defaults: TP 1, which a 70B cannot fit: INFEASIBLE before launch),
        # the prior's top 3, then TPE
        "search": {**NO_REMEASURE, "sampler": "tpe", "n_trials": 5 if sim else 3, "seed": 0,
                   "baseline": sim,
                   "prior": "aiconfigurator", "prior_top_k": TOP_K},
        "cluster": {"address": address, "max_concurrent_trials": 2},
        "results_dir": str(folder / "results"),
    }))
    return path


@pytest.fixture
def two_by_eight(short_tmp):
    nodes = [{"num_cpus": 1, "num_gpus": 0}] + [
        {"num_cpus": 8, "num_gpus": 8, "node_ip_address": f"127.0.0.{i + 2}"} for i in range(2)]
    with emulated_cluster(short_tmp, nodes) as (_, address, marker):
        yield address, marker


@pytest.mark.timeout(900)
def test_a_70b_sweep_on_2x8_simulated_gpus_starts_from_the_prior_and_reports_its_error(
        llama70b, short_tmp, two_by_eight, monkeypatch):
    from framework.engine.predictor import predictor
    from framework.sweep.loader import load
    from framework.sweep.prior import Prior

    address, marker = two_by_eight
    path = _sweep(short_tmp, llama70b, address, "sim70b", sim=True)
    res = cli_in_process("validate", str(path), cwd=short_tmp)
    assert res.returncode == 0 and f"search.prior aiconfigurator: on (GPU {GPU})" in res.stdout, \
        res.stdout

    res = cli_joined(["run", str(path)], short_tmp, marker, short_tmp)
    assert res.returncode in (0, 4), res.stdout[-4000:] + res.stderr[-4000:]
    trials = read_trials(short_tmp / "results", "sim70b").sort_values("trial_number")
    assert len(trials) == 5
    assert trials.iloc[0]["is_baseline"] and trials.iloc[0]["state"] == "INFEASIBLE"
    expected = Prior(load(path, check_flags=False), predictor("aiconfigurator")).first(TOP_K)
    ran = [{"tensor-parallel-size": int(r["param_tensor_parallel_size"]),
            "max-num-seqs": int(r["param_max_num_seqs"]),
            "kv-cache-dtype": r["param_kv_cache_dtype"]} for _, r in trials.iloc[1:1 + TOP_K].iterrows()]
    assert ran == expected

    measured = trials[trials["state"] == "COMPLETE"]
    assert len(measured) >= TOP_K
    for metric in ("output_throughput", "p99_tpot_ms", "mean_ttft_ms"):
        predicted, got = measured[f"predicted_{metric}"], measured[metric]
        assert predicted.notna().all() and (predicted > 0).all(), metric
        # the truth is the model x an error field of size 0.3: not the prediction itself
        assert ((predicted - got).abs() / got > 0.01).any(), metric
    assert (measured["predictor"] == "aiconfigurator").all()
    assert (measured["predicted_kv_blocks"] > 0).all()

    report = short_tmp / "report.html"
    res = cli_in_process("report", str(path), "--out", str(report), cwd=short_tmp)
    assert res.returncode == 0, res.stdout + res.stderr
    page = report.read_text()
    section = page[page.index("Predicted vs measured"):]
    assert "<table id='prediction'>" in section
    for metric in ("output_throughput", "p99_tpot_ms"):
        assert f"<td>{metric}</td>" in section
    assert "Memory per GPU, the predictor's model against ours" in section  # both estimated

    # without the extra: validate says the prior is off, and a sweep runs unchanged
    monkeypatch.setitem(sys.modules, "aiconfigurator_core", None)
    plain = _sweep(short_tmp, llama70b, address, "plain70b", sim=False)
    res = cli_in_process("validate", str(plain), cwd=short_tmp)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "search.prior aiconfigurator: off: the `predict` extra is not installed" in res.stdout
    res = cli_joined(["run", str(plain)], short_tmp, marker, short_tmp)
    assert res.returncode in (0, 4), res.stdout[-4000:] + res.stderr[-4000:]
    assert "search.prior aiconfigurator is off" in res.stdout
    rows = read_trials(short_tmp / "results", "plain70b")
    assert len(rows) == 3 and rows["predicted_output_throughput"].isna().all()
    assert rows["predictor"].isna().all()
    assert (rows["state"] == "COMPLETE").all() and (rows["output_throughput"] > 0).all()
