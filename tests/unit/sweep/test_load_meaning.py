"""sweep.load_meaning: which sweeps would rank the offered load rather than configurations
(#34 item 1), each case of the rule on a sweep built as a user writes it, and the shipped
chat_mix and trace_replay sweeps as they stood before #34 (the objection in one line)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from framework.base.errors import ConfigError
from framework.config.search_space import load_search_space
from framework.config.specs import SweepSpec
from framework.sweep import loader
from framework.sweep.load_meaning import fixed_load
from framework.sweep.load_meaning import load_bound_problem
from tests.cli import cli_in_process
from tests.paths import ROOT

TRACE = {"dataset": "timed_trace", "dataset_path": str(ROOT / "datasets" / "mooncake_sample.jsonl"),
         "timed_trace": {"chunk_hash_size": 16, "sec_multiplier": 0.001}}
CONC_RUN = {"max-concurrency": {"type": "categorical", "choices": [4, 8], "kind": "run"}}
FLAG = {"max-num-seqs": {"type": "categorical", "choices": [4, 8], "default": 8}}


def problem(tmp: Path, workload: dict[str, Any], space: dict[str, Any],
            **extra: Any) -> tuple[str, str, object, str] | None:
    (tmp / "space.yaml").write_text(yaml.safe_dump({"parameters": space}))
    spec = SweepSpec.model_validate({"name": "t", "model": str(ROOT / "models" / "tiny-llama"),
                                     "search_space": str(tmp / "space.yaml"),
                                     "workload": workload, **extra})
    load_search_space(tmp / "space.yaml")  # valid as written
    return load_bound_problem(tmp / "t.yaml", spec)


@pytest.mark.parametrize(("workload", "space", "extra", "key"), [
    # a throughput at a fixed offered load: a rate, a trace at its own times, sessions at a rate
    ({"request_rate": 4}, FLAG, {}, "objective.metric"),
    (TRACE, FLAG, {}, "objective.metric"),
    ({"request_rate": 4}, FLAG, {"objective": {"metric": "request_throughput"}},
     "objective.metric"),
    ({"request_rate": 4}, FLAG, {"objective": {"metric": "p99_ttft_ms", "direction": "minimize",
                                               "pareto_with": ["output_throughput"]}},
     "objective.pareto_with"),
    # what discriminates at a fixed load: a latency, goodput; a closed loop; capacity's own rate
    ({"request_rate": 4}, FLAG, {"objective": {"metric": "p99_ttft_ms", "direction": "minimize"}},
     None),
    ({"request_rate": 4}, FLAG, {"objective": {"metric": "request_goodput"},
                                 "sla": {"p99_ttft_ms": 500}}, None),
    ({"max_concurrency": 8}, FLAG, {}, None),
    ({"request_rate": 4}, FLAG, {"capacity": {}, "sla": {"p99_ttft_ms": 500}}, None),
    # kept on purpose
    ({"request_rate": 4}, CONC_RUN, {"objective": {"allow_load_bound": True}}, None),
])
def test_what_ranks_the_load(tmp_path, workload, space, extra, key):
    found = problem(tmp_path, workload, space, **extra)
    assert (found[1] if found else None) == key, found
    if found:
        assert "\n" not in found[3] and "allow_load_bound" in found[3]
        assert "latency percentile" in found[3] and "capacity" in found[3]


def test_each_workload_of_several_is_judged():
    """The second of two workloads fixes its load: named by its own key."""
    spec = SweepSpec.model_validate({
        "name": "t", "model": str(ROOT / "models" / "tiny-llama"), "search_space": "s.yaml",
        "workloads": [{"name": "free", "max_concurrency": 8},
                      {"name": "paced", "request_rate": 3}]})
    found = load_bound_problem(Path("t.yaml"), spec)
    assert found is not None and found[3].startswith("workloads.paced starts 3 requests/s")


@pytest.mark.parametrize(("workload", "expected"), [
    ({}, None),
    ({"max_concurrency": 4}, None),
    ({"request_rate": 2.5}, "starts 2.5 requests/s"),
    (TRACE, "replays a timed trace at its own times"),
    ({**TRACE, "speed_up": 3}, "replays a timed trace at its own times (3x)"),
])
def test_fixed_load(workload, expected):
    spec = SweepSpec.model_validate({"name": "t", "model": "m", "search_space": "s.yaml",
                                     "workload": workload})
    assert fixed_load(spec.workload) == expected


BEFORE = ROOT / "tests" / "fixtures" / "before_34"  # the examples as shipped at 0d0d337


@pytest.mark.parametrize(("stem", "key"), [("chat_mix", "objective.metric"),
                                           ("trace_replay", "objective.metric")])
def test_the_examples_as_they_were_get_the_one_line_objection(tmp_path, stem, key):
    doc = yaml.safe_load((BEFORE / f"{stem}.yaml").read_text())
    doc["search_space"] = str(BEFORE / "trace_replay_space.yaml" if stem == "trace_replay"
                              else ROOT / doc["search_space"])
    doc["model"] = str(ROOT / doc["model"])
    doc["results_dir"] = str(tmp_path / "results")
    if "workload" in doc and "dataset_path" in doc["workload"]:
        doc["workload"]["dataset_path"] = str(ROOT / doc["workload"]["dataset_path"])
    old = tmp_path / f"{stem}.yaml"
    old.write_text(yaml.safe_dump(doc))
    for command in ("validate", "plan"):
        res = cli_in_process(command, str(old), cwd=tmp_path)
        assert res.returncode == 2, command + res.stdout + res.stderr
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and key in lines[0] and "Traceback" not in res.stderr, res.stderr
    with pytest.raises(ConfigError):  # the same objection where run and plan load the sweep
        loader.load(old)
