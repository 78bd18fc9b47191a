"""What the project ships, checked against the memory model: the GPU table's sizes, every
search space and sweep passing `validate`'s checks (every value against the installed vLLM),
and the GPU sweeps starting at vLLM's defaults."""


from __future__ import annotations

import pytest

from framework.config.search_space import load_search_space
from framework.engine.feasibility import DEFAULT_GPU_MEMORY_UTILIZATION
from framework.engine.feasibility import GIB
from framework.engine.feasibility import GPUS
from framework.engine.feasibility import batch_defaults
from framework.engine.feasibility import check
from framework.engine.feasibility import read_model_facts
from framework.engine.flag_check import value_problem
from framework.sweep import loader as sweep
from framework.sweep.value_checks import probe_values
from tests.paths import ROOT as REPO

R1_70B = read_model_facts(REPO / "model_configs" / "deepseek-r1-distill-llama-70b")
LLAMA_8B = read_model_facts(REPO / "model_configs" / "llama-3.1-8b-instruct")
A100 = GPUS["A100-80GB"]
H100 = GPUS["H100-80GB"]


@pytest.mark.parametrize("name, gib", [
    # cudaMemGetInfo totals, as torch's OOM message prints them ("GPU 0 has a total capacity
    # of X GiB"): less than the marketed size, ~0.5-0.9 GiB less than nvidia-smi's MiB
    ("A100-80GB", 79.15), ("A100-40GB", 39.39), ("H100-80GB", 79.11), ("H200-141GB", 139.81),
    ("L40S-48GB", 44.52), ("A10G-24GB", 21.99), ("L4-24GB", 22.03),
])
def test_gpu_table(name, gib):
    gpu = GPUS[name]
    assert gpu.memory_bytes == round(gib * GIB)
    marketed = int(name.split("-")[1].removesuffix("GB"))  # GB read as GiB: an upper bound
    assert 0.9 * marketed * GIB < gpu.memory_bytes < marketed * GIB


def test_gpu_table_tells_the_two_a100s_apart():
    assert GPUS["A100-40GB"].memory_bytes < 40 * GIB < 79 * GIB < A100.memory_bytes
    assert check(R1_70B, GPUS["A100-40GB"], {"tensor-parallel-size": 2}).reasons[0].startswith(
        "weights need 65.71 GiB")  # 70.55e9 x 2 B / 2 > 0.92 x 39.39 GiB


SPACES = sorted((REPO / "search_spaces").glob("*.yaml"))


SWEEPS = sorted((REPO / "sweeps").glob("*.yaml"))


GPU_OF_SPACE = {"llama70b_8xa100": A100, "llama8b_1xh100": H100, "llama70b_2x8_multinode": H100}


@pytest.mark.parametrize("path", SPACES, ids=lambda p: p.stem)
def test_every_shipped_search_space_loads_and_vllm_takes_its_values(path):
    space = load_search_space(path)
    assert space.parameters
    for name in space.server_params(space.parameters):
        for _, value in probe_values(space.parameters[name]):
            assert value_problem(name, value) is None, (name, value)


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_every_shipped_sweep_validates(path, monkeypatch):
    monkeypatch.chdir(REPO)
    loaded = sweep.load(path.relative_to(REPO))  # every check `validate` makes
    assert loaded.spec.name
    if path.stem in GPU_OF_SPACE:
        assert loaded.spec.gpu == GPU_OF_SPACE[path.stem].name


@pytest.mark.parametrize("stem", sorted(GPU_OF_SPACE))
def test_gpu_spaces_start_at_vllms_defaults_and_fit_for_some_tp(stem):
    space = load_search_space(REPO / "search_spaces" / f"{stem}.yaml")
    defaults = space.defaults()
    assert (defaults["max-num-batched-tokens"], defaults["max-num-seqs"]) == batch_defaults(
        GPU_OF_SPACE[stem])
    assert defaults["gpu-memory-utilization"] == DEFAULT_GPU_MEMORY_UTILIZATION
    assert (defaults["max-model-len"], defaults["kv-cache-dtype"]) == (131072, "auto")
    assert (defaults["enable-chunked-prefill"], defaults["enable-prefix-caching"]) == (True, True)
    tps = list(getattr(space.parameters.get("tensor-parallel-size"), "choices", (1,)))
    model = R1_70B if "70b" in stem else LLAMA_8B
    assert any(check(model, GPU_OF_SPACE[stem], {**defaults, "tensor-parallel-size": tp}).ok
               for tp in tps)
