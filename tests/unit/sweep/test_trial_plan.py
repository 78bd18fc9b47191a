"""What a trial's deployment shape asks of the cluster (sweep/trial_plan.py), on the CPU
engine: a bundle per engine of every server, the devices per-device metrics and prices
divide by, and the shape label. Table-tested over the shapes of issue #36, 2 replicas of
data parallel 2 included (its real-vLLM run left the shapes e2e, whose grid is now the four
shapes of the acceptance)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from framework.config.search_space import SearchSpace
from framework.search.tuner import Proposal
from framework.sweep.loader import load
from framework.sweep.trial_load import load_plan
from framework.sweep.trial_plan import may_prefill
from framework.sweep.trial_plan import plan_trial
from framework.sweep.trial_plan import prefill_decode_problem

CPUS_PER_WORKER = 1


def _sweep(tmp_path: Path, model: Path) -> Path:
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        "prefill-servers": {"type": "categorical", "choices": [0, 1], "kind": "shape",
                            "default": 0},
        "replicas": {"type": "categorical", "choices": [1, 2], "kind": "shape", "default": 1},
        "data-parallel-size": {"type": "categorical", "choices": [1, 2], "default": 1}}}))
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "shapes", "model": str(model), "search_space": str(space), "engine": "cpu",
        "cluster": {"cpus_per_worker": CPUS_PER_WORKER},
        "workload": {"num_prompts": 4, "input_len": 16, "output_len": 4},
        "results_dir": str(tmp_path / "results")}))
    return sweep


@pytest.mark.parametrize(("params", "bundles", "devices", "label"), [
    ({}, 1, 1, "TP1xPP1"),
    ({"data-parallel-size": 2}, 2, 2, "TP1xPP1xDP2"),
    ({"replicas": 2}, 2, 2, "2xTP1xPP1"),
    ({"replicas": 2, "data-parallel-size": 2}, 4, 4, "2xTP1xPP1xDP2"),
    ({"prefill-servers": 1}, 2, 2, "1P1DxTP1xPP1"),
    ({"prefill-servers": 1, "replicas": 2}, 3, 3, "1P2DxTP1xPP1"),
])
def test_a_shape_asks_a_bundle_per_engine_of_every_server(tmp_path, tiny_model, params, bundles,
                                                          devices, label):
    sweep = load(_sweep(tmp_path, tiny_model), check_flags=False)
    plan = plan_trial(sweep, Proposal(0, params, False, trial=None), load_plan(sweep.spec))
    assert len(plan.all_wanted) == bundles
    assert all(b == {"CPU": float(CPUS_PER_WORKER)} for b in plan.all_wanted)
    assert plan.devices == devices
    assert plan.shape_label == label
    assert plan.servers == params.get("replicas", 1) + params.get("prefill-servers", 0)
    assert "replicas" not in plan.serve_flags and "prefill-servers" not in plan.serve_flags


@pytest.mark.parametrize(("engine", "prefill", "nodes", "shared", "says"), [
    ("cpu", 0, 3, None, None),                      # no prefill server: nothing to hand over
    ("cpu", 1, 1, None, None),                      # one node: the driver's folder serves
    ("cpu", 1, 2, None, "cluster.shared_folder"),   # two nodes, no shared folder: refused
    ("cpu", 1, 2, "/mnt/shared", None),             # ... with one: P and D may be apart
    ("gpu", 1, 1, "/mnt/shared", "kv_transfer_params"),  # NixlConnector: the router lacks it
])
def test_prefill_decode_problem(engine, prefill, nodes, shared, says):
    found = prefill_decode_problem(engine, prefill, nodes, shared)
    assert (found is None) == (says is None)
    assert says is None or says in found


def test_may_prefill():
    def space(choices):
        return SearchSpace.model_validate({"parameters": {"prefill-servers": {
            "type": "categorical", "choices": choices, "kind": "shape"}}})

    assert may_prefill(space([0, 1])) and not may_prefill(space([0]))
    assert not may_prefill(SearchSpace.model_validate(
        {"parameters": {"max-num-seqs": {"type": "categorical", "choices": [1, 2]}}}))
