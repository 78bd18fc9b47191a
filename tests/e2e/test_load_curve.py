"""A searched load setting measured as a curve per configuration (#34 item 3, sweep.load_curve):
a FakeEngine sweep (the named stand-in: what is under test is the sweep's shape, its rows and
its verdict, not vLLM) searching max-num-seqs next to max-concurrency as `kind: run`."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.cli import cli_in_process
from tests.cli import run_joined
from tests.clusters import join_shared
from tests.paths import TINY_MODEL
from tests.sweeps import NO_REMEASURE
from tests.sweeps import read_trials

LOADS = [1, 6]


@pytest.mark.server
@pytest.mark.timeout(300)
def test_a_searched_load_is_a_curve_of_every_configuration_not_a_competitor(shared_ray,
                                                                             short_tmp):
    """Guards #34 item 3: a throughput rises with max-concurrency, so with the load searched as
    a competitor the trial that was sent more load won (and since 8105fd6 such a sweep was
    refused). Now each configuration (max-num-seqs 1 or 6) is measured at both concurrencies on
    its own server: two trials, not four; a workloads row per (trial, load) with the load in
    its column; the trial's throughput is the worst of its two loads; the winner is named by
    its flag alone, and the report draws one curve per configuration."""
    space = short_tmp / "space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        "max-num-seqs": {"type": "categorical", "choices": [1, 6]},
        "max-concurrency": {"type": "categorical", "choices": LOADS, "kind": "run"}}}))
    sweep = short_tmp / "curve.yaml"
    sweep.write_text(yaml.safe_dump(join_shared({
        "name": "curve", "model": str(TINY_MODEL), "search_space": str(space), "engine": "fake",
        "server": {"env": {"FAKE_ENGINE_STARTUP_S": "0", "FAKE_ENGINE_TPOT_MS": "20"}},
        # 48 requests of ~0.16 s: at concurrency 6, max-num-seqs 6 takes ~1.3 s and 1 ~7.7 s,
        # so the 2x below holds through a stall of ~2.5 s (12 requests: ~0.6 s did not)
        "workload": {"num_prompts": 48, "input_len": 16, "output_len": 8, "warmup_requests": 0},
        "objective": {"metric": "output_throughput", "direction": "maximize"},
        "search": {**NO_REMEASURE, "sampler": "grid", "n_trials": 2, "baseline": False},
        "results_dir": str(short_tmp / "results")}, shared_ray)))
    res = run_joined(shared_ray, ["run", str(sweep)], short_tmp)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]

    trials = read_trials(short_tmp / "results", "curve").sort_values("trial_number")
    assert len(trials) == 2 and (trials["state"] == "COMPLETE").all()
    assert "param_max_concurrency" not in trials, list(trials.columns)
    assert sorted(trials["param_max_num_seqs"]) == [1, 6]
    import duckdb

    rows = duckdb.sql(
        f"SELECT trial_number, workload, max_concurrency, output_throughput "
        f"FROM read_parquet('{short_tmp}/results/curve/workloads/**/*.parquet', "
        f"hive_partitioning=true) ORDER BY trial_number, max_concurrency").fetchall()
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (n, f"max-concurrency-{c}", c) for n in trials["trial_number"] for c in LOADS]
    for number, objective in zip(trials["trial_number"], trials["output_throughput"]):
        curve = [r[3] for r in rows if r[0] == number]
        assert objective == pytest.approx(min(curve))  # objective.aggregate: min
    # max-num-seqs 6 decodes 6 at once at concurrency 6, max-num-seqs 1 one: the flag wins
    seqs = dict(zip(trials["trial_number"], trials["param_max_num_seqs"]))
    high = {seqs[r[0]]: r[3] for r in rows if r[2] == 6}
    assert high[6] > 2 * high[1], rows

    best = cli_in_process("best", str(sweep), "--format", "json", cwd=short_tmp)
    assert best.returncode == 0, best.stdout + best.stderr
    shipped = json.loads(best.stdout)
    assert "max-concurrency" not in json.dumps(shipped)
    report = cli_in_process("report", str(sweep), cwd=short_tmp)
    assert report.returncode == 0, report.stdout + report.stderr
    page = (short_tmp / "results" / "curve" / "report.html").read_text()
    section = page[page.index("Latency against load"):page.index("Parameter importances")]
    assert "max concurrency" in section
    for number, seqs_value in zip(trials["trial_number"], trials["param_max_num_seqs"]):
        # one curve per configuration, named by its flag
        assert section.count(f'"name":"trial {number}: max-num-seqs={seqs_value}"') == 1
