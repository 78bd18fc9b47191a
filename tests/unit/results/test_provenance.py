"""Provenance columns: code commit, hardware, model and workload digests."""

from __future__ import annotations

import hashlib
import os
import re

import pytest

from framework.config.specs import SweepSpec
from framework.results.provenance import cpu_name
from framework.results.provenance import git_commit
from framework.results.provenance import hardware
from framework.results.provenance import provenance
from framework.results.provenance import workload_sha256
from tests.paths import ROOT


def spec(**workload) -> SweepSpec:
    return SweepSpec.model_validate({"name": "p", "model": str(ROOT / "models" / "tiny-llama"),
                                     "search_space": "s.yaml", "workload": workload})


def test_git_commit_of_this_checkout_and_outside_one(tmp_path):
    assert re.fullmatch(r"[0-9a-f]{40}", git_commit(ROOT))
    assert git_commit(tmp_path) == "unknown"


@pytest.mark.parametrize("engine, nodes, expected", [
    ("gpu", [{"GPU": 8.0, "CPU": 96.0, "accelerator_type:A100-80G": 1.0},
             {"GPU": 8.0, "accelerator_type:A100-80G": 1.0}], ("gpu: 16 x A100-80G", 16)),
    ("gpu", [{"GPU": 4.0}, {"CPU": 8.0}], ("gpu: 4 x unknown type", 4)),
    ("fake", [{"GPU": 2.0}], ("gpu: 2 x unknown type", 2)),
])
def test_hardware_of_gpu_clusters(engine, nodes, expected):
    assert hardware(engine, nodes) == expected


def test_hardware_of_the_cpu_engine():
    described, count = hardware("cpu", [{"CPU": 2.0}, {"CPU": 4.0}])
    assert described == f"cpu: {cpu_name()} x {os.cpu_count()}" and count == 6


def test_workload_digest_follows_what_is_sent():
    assert workload_sha256(spec()) == workload_sha256(spec())
    assert workload_sha256(spec()) != workload_sha256(spec(num_prompts=201))
    assert workload_sha256(spec(seed=1)) != workload_sha256(spec(seed=2))


def test_provenance_row_values(tiny_model):
    values = provenance(spec(), [{"CPU": 2.0}])
    config = (tiny_model / "config.json").read_bytes()
    assert values["model_config_sha256"] == hashlib.sha256(config).hexdigest()
    assert values["model_path"] == str(tiny_model.resolve())
    assert values["hardware"].startswith("cpu: ") and values["device_count"] == 2
