"""The executor rules of a GPU sweep (#32): distributed-executor-backend and data-parallel-size
against the trial's placement group. cluster.placement.executor_problem per trial,
sweep.cross_checks.parallel_problem over every value a flag takes, and `validate` (sweep.loader.load)
on real files with the tiny model (4 heads, 2 KV heads: TP 2 shards it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from framework.base.errors import ConfigError
from framework.cluster.placement import Shape
from framework.cluster.placement import data_parallel_problem
from framework.cluster.placement import executor_problem
from framework.cluster.placement import shape_problem
from framework.sweep import loader
from framework.sweep.cross_checks import parallel_problem


@pytest.mark.parametrize("backend, tp, pp, dp, found", [
    (None, 1, 1, 1, None),
    (None, 2, 2, 1, None),          # vllm-sweep sets ray itself
    ("ray", 2, 1, 1, None),
    ("ray", 1, 2, 1, None),
    ("mp", 1, 1, 1, None),
    ("uni", 1, 1, 1, None),
    ("mp", 2, 1, 1, "physical GPUs 0..1"),
    ("mp", 1, 4, 1, "TP 1 x PP 4 = 4 workers would take physical GPUs 0..3"),
    ("ray", 1, 1, 1, "never starts"),
    ("uni", 2, 1, 1, "starts rank 0 alone"),   # its rank 0 waits for the others forever
    ("uni", 1, 2, 1, "TP 1 x PP 2 = 2 starts rank 0 alone"),
    (None, 1, 1, 2, "data-parallel-size 2 is supported on the CPU engine only"),
    ("ray", 2, 1, 4, "data-parallel-size 4"),
    ("ray", 1, 1, 2, "supported on the CPU engine only"),  # DP is refused before the backend
])
def test_executor_problem(backend, tp, pp, dp, found):
    problem = executor_problem(backend, Shape(tp=tp, pp=pp), dp)
    assert (problem is None) if found is None else (found in problem)


B, DP, TP, PP = ("distributed-executor-backend", "data-parallel-size", "tensor-parallel-size",
                 "pipeline-parallel-size")


@pytest.mark.parametrize("values, found", [
    ({}, None),
    ({TP: [1, 2]}, None),
    ({B: ["mp"], TP: [2]}, (B, "mp", "physical GPUs 0..1")),
    ({B: ["ray"]}, (B, "ray", "never starts")),
    ({B: ["ray"], TP: [1], PP: [1]}, (B, "ray", "never starts")),
    ({DP: [2]}, (DP, 2, "supported on the CPU engine only")),
    # searched: a value that works with some other values passes (refused per trial)
    ({B: ["mp", "ray"], TP: [1, 2]}, None),
    ({B: ["ray", None], TP: [1, 4]}, None),
    ({DP: [1, 2]}, (DP, 2, "supported on the CPU engine only")),
    # mp searched against a fixed TP 2: mp fails in every trial
    ({B: ["mp", "ray"], TP: [2]}, (B, "mp", "physical GPUs 0..1")),
    # ray fixed, TP searched over 1 and 2: TP 1 fails in every trial
    ({B: ["ray"], TP: [1, 2]}, (TP, 1, "never starts")),
    ({B: ["mp"], PP: [1, 2]}, (PP, 2, "physical GPUs 0..1")),
    ({B: ["uni"], TP: [2]}, (B, "uni", "starts rank 0 alone")),
    ({B: [None, "ray"], TP: [1]}, (B, "ray", "never starts")),  # None: a `when` leaves it out
])
def test_parallel_problem(values, found):
    problem = parallel_problem(values)
    assert problem == found if found is None else (problem[:2] == found[:2]
                                                   and found[2] in problem[2])


SPACE = {"parameters": {"max-num-seqs": {"type": "int", "low": 2, "high": 64, "default": 64}}}


def write(tmp: Path, model: Path, args: dict[str, Any],
          params: dict[str, Any] | None = None) -> Path:
    """A GPU sweep of the tiny model with these server.args and parameters."""
    space_path = tmp / "space.yaml"
    space_path.write_text(yaml.safe_dump({"parameters": params} if params else SPACE))
    body = {"name": "v", "model": str(model), "search_space": str(space_path), "engine": "gpu",
            "server": {"args": args}, "workload": {"input_len": 64, "output_len": 16},
            "results_dir": str(tmp / "results")}
    path = tmp / "sweep.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def choices(*values: Any) -> dict[str, Any]:
    return {"type": "categorical", "choices": list(values), "default": values[0]}


@pytest.mark.parametrize("args, params, file, key, value, found", [
    ({B: "mp", TP: 2}, None, "sweep.yaml", f"server.args.{B}", "mp", "physical GPUs 0..1"),
    ({B: "ray"}, None, "sweep.yaml", f"server.args.{B}", "ray", "never starts"),
    ({DP: 2}, None, "sweep.yaml", f"server.args.{DP}", 2, "supported on the CPU engine only"),
    ({TP: 2}, {B: choices("ray", "mp")}, "space.yaml", f"parameters.{B}", "mp",
     "physical GPUs 0..1"),
    ({B: "ray"}, {TP: choices(2, 1)}, "space.yaml", f"parameters.{TP}", 1, "never starts"),
    ({}, {DP: {"type": "int", "low": 1, "high": 2, "default": 1}}, "space.yaml",
     f"parameters.{DP}", 2, "supported on the CPU engine only"),
])
def test_validate_refuses_in_one_line(tmp_path, tiny_model, args, params, file, key, value,
                                      found):
    with pytest.raises(ConfigError) as caught:
        loader.load(write(tmp_path, tiny_model, args, params))
    err = caught.value
    assert (err.file, err.key, err.value) == (str(tmp_path / file), key, value)
    assert found in err.reason and "\n" not in str(err)


@pytest.mark.parametrize("args, params", [
    ({TP: 2}, None),
    ({B: "ray", TP: 2}, None),
    ({B: "mp"}, None),
    ({}, {B: choices("ray", "mp"), TP: choices(1, 2)}),  # some trials work: refused per trial
])
def test_validate_passes(tmp_path, tiny_model, args, params):
    assert loader.load(write(tmp_path, tiny_model, args, params)).spec.engine == "gpu"


def test_the_cpu_engine_is_left_alone(tmp_path, tiny_model):
    path = write(tmp_path, tiny_model, {B: "ray"})
    path.write_text(path.read_text().replace("engine: gpu", "engine: cpu"))
    assert loader.load(path).spec.engine == "cpu"


@pytest.mark.parametrize("engine, tp, pp, dp, found", [
    ("cpu", 1, 1, 1, None),
    ("cpu", 1, 1, 2, None),          # vLLM's DP engines as processes of the server's node
    ("cpu", 1, 1, 4, None),
    ("cpu", 2, 1, 2, "with TP 2 x PP 1 > 1 is not supported"),
    ("cpu", 1, 2, 2, "with TP 1 x PP 2 > 1 is not supported"),
    ("gpu", 1, 1, 2, "supported on the CPU engine only"),
    ("fake", 1, 1, 2, "supported on the CPU engine only"),  # FakeEngine fakes GPUs
    ("gpu", 2, 1, 1, None),
])
def test_data_parallel_problem(engine, tp, pp, dp, found):
    problem = data_parallel_problem(engine, Shape(tp, pp, dp))
    assert (problem is None) if found is None else (found in problem)


@pytest.mark.parametrize("engine, backend, shape, found", [
    ("cpu", "ray", Shape(1, 1, 1), None),    # the CPU engine's executor is vllm-sweep's
    ("cpu", None, Shape(1, 1, 2), None),
    ("cpu", None, Shape(2, 1, 2), "not supported"),
    ("gpu", "ray", Shape(1, 1, 1), "never starts"),
    ("gpu", None, Shape(1, 1, 2), "CPU engine only"),
])
def test_shape_problem_by_engine(engine, backend, shape, found):
    problem = shape_problem(engine, backend, shape)
    assert (problem is None) if found is None else (found in problem)


@pytest.mark.parametrize("values, found", [
    ({DP: [2]}, None),
    ({DP: [1, 2], TP: [1, 2]}, None),  # some trials work: refused per trial
    ({DP: [2], TP: [2]}, (DP, 2, "not supported")),
])
def test_parallel_problem_on_the_cpu_engine(values, found):
    problem = parallel_problem(values, "cpu")
    assert problem == found if found is None else (problem[:2] == found[:2]
                                                   and found[2] in problem[2])


def test_validate_refuses_cpu_data_parallel_with_tensor_parallel(tmp_path, tiny_model):
    path = write(tmp_path, tiny_model, {DP: 2, TP: 2})
    path.write_text(path.read_text().replace("engine: gpu", "engine: cpu"))
    with pytest.raises(ConfigError) as caught:
        loader.load(path)
    assert (caught.value.key, caught.value.value) == (f"server.args.{DP}", 2)


def test_validate_passes_cpu_data_parallel(tmp_path, tiny_model):
    path = write(tmp_path, tiny_model, {DP: 2})
    path.write_text(path.read_text().replace("engine: gpu", "engine: cpu"))
    assert loader.load(path).spec.engine == "cpu"
