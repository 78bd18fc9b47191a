"""The memory model at TP or PP > 1 (#32): the NCCL and custom all-reduce buffers vLLM
allocates before its start-up snapshot, and the (tied) LM head of the last pipeline stage.
Pure; expected values worked by hand from the constants' sources."""

from __future__ import annotations

import pytest

from framework.engine import memory_model as mm
from framework.engine.feasibility import GIB
from framework.engine.feasibility import GPUS
from framework.engine.feasibility import check
from framework.engine.feasibility import read_model_facts
from tests.paths import ROOT as REPO

LLAMA_8B = read_model_facts(REPO / "model_configs" / "llama-3.1-8b-instruct")


@pytest.mark.parametrize("gpu, util, tp, pp, fails", [
    # request_memory: total - ceil(total x util) must hold the 0.51 GiB context, and at
    # TP x PP > 1 the 0.66 GiB of communication buffers too (1.17 GiB)
    ("L4-24GB", 0.97, 1, 1, False),    # 22.03 GiB x 0.03 = 0.66 GiB >= 0.51
    ("L4-24GB", 0.97, 2, 1, True),     # 0.66 < 1.17: vLLM refuses it at start-up
    ("L4-24GB", 0.95, 2, 1, True),     # 1.10 < 1.17
    ("L4-24GB", 0.94, 2, 1, False),    # 1.32
    ("L4-24GB", 0.97, 1, 2, True),     # PP's NCCL group alone: 0.51 + 0.625 = 1.14 > 0.66
    ("H100-80GB", 0.99, 1, 1, False),  # 79.11 x 0.01 = 0.79 GiB
    ("H100-80GB", 0.99, 2, 1, True),   # 0.79 < 1.17
    ("H100-80GB", 0.98, 2, 1, False),  # 1.58
])
def test_startup_check_charges_communication_buffers(gpu, util, tp, pp, fails):
    result = check(LLAMA_8B, GPUS[gpu], {"gpu-memory-utilization": util, "max-model-len": 4096,
                                         "max-num-seqs": 16, "tensor-parallel-size": tp,
                                         "pipeline-parallel-size": pp})
    assert any("CUDA context" in r for r in result.reasons) == fails, result.reasons


@pytest.mark.parametrize("tp, pp, mib", [
    (1, 1, 0),
    (2, 1, 32 * 2 * 10 + 32),  # NCCL: 32 channels x 2 connections x 10 MiB; custom all-reduce
    (8, 1, 32 * 2 * 10 + 32),
    (1, 2, 32 * 2 * 10),       # no TP group: no custom all-reduce
    (2, 2, 32 * 2 * 10 + 32),
])
def test_communication_buffers(tp, pp, mib):
    assert mm.comm_init_bytes(tp, pp) == mib * mm.MIB


def test_the_refusal_names_the_buffers():
    (reason,) = check(LLAMA_8B, GPUS["L4-24GB"], {"gpu-memory-utilization": 0.97,
                                                  "max-model-len": 4096, "max-num-seqs": 16,
                                                  "tensor-parallel-size": 2}).reasons
    assert reason == ("gpu-memory-utilization 0.97 leaves 0.66 GiB of the 22.03 GiB outside "
                      "vLLM's share, less than the ~0.51 GiB CUDA context and ~0.66 GiB of NCCL "
                      "and all-reduce buffers at TP 2 x PP 1 (~1.17 GiB): vLLM's start-up check "
                      "fails (free memory less than desired GPU memory utilization)")
    assert 672 * mm.MIB / GIB == pytest.approx(0.656, abs=1e-3)
