"""cluster.yaml against what it must fit, without starting anything: every GPU the shipped sweeps
name has a node type with that GPU and count, every GPU node type is a known AWS instance, and
only one GPU type can start workers. The token tests, which run the file's commands and a
loopback cluster, are in tests/e2e/test_cluster_yaml.py (they read the file through `cluster`)."""

from __future__ import annotations

import yaml

from framework.engine.feasibility import GPUS
from tests.helpers import ROOT

CLUSTER = ROOT / "cluster.yaml"

# AWS instance type -> (GPU name as in framework.engine.feasibility.GPUS, GPUs per instance).
# Source: AWS's instance-type pages "Amazon EC2 P4 Instances" (p4d.24xlarge: 8 x A100 40 GB;
# p4de.24xlarge: 8 x A100 80 GB) and "Amazon EC2 P5 Instances" (p5.48xlarge: 8 x H100 80 GB).
AWS_GPUS: dict[str, tuple[str, int]] = {
    "p4d.24xlarge": ("A100-40GB", 8),
    "p4de.24xlarge": ("A100-80GB", 8),
    "p5.48xlarge": ("H100-80GB", 8),
}


def cluster() -> dict:
    """cluster.yaml, parsed."""
    return yaml.safe_load(CLUSTER.read_text())


def gpu_node_types(cfg: dict) -> dict[str, tuple[str, int, dict]]:
    """Node type name -> (GPU name, GPUs per instance, node type) for every type with GPUs."""
    out = {}
    for name, node in cfg["available_node_types"].items():
        instance = node["node_config"]["InstanceType"]
        if instance in AWS_GPUS:
            out[name] = (*AWS_GPUS[instance], node)
    return out


def sweep_gpus() -> set[str]:
    """The `gpu:` of every shipped sweep (sweeps/*.yaml) that names one."""
    found = set()
    for path in sorted((ROOT / "sweeps").glob("*.yaml")):
        gpu = (yaml.safe_load(path.read_text()) or {}).get("gpu")
        if gpu:
            found.add(gpu)
    return found


def test_every_sweep_gpu_has_a_node_type_with_that_gpu_and_count():
    cfg = cluster()
    types = gpu_node_types(cfg)
    wanted = sweep_gpus()
    assert {"A100-80GB", "H100-80GB"} <= wanted  # the shipped sweeps' GPUs, read from the files
    for gpu in wanted:
        matching = [name for name, (g, _, _) in types.items() if g == gpu]
        assert matching, f"no node type in cluster.yaml has {gpu} (types: {types})"
    for name, (gpu, count, node) in types.items():
        assert gpu in GPUS, (name, gpu)
        assert node["resources"] == {"GPU": count}, (name, node["resources"])


def test_gpu_nodes_are_known_instances_and_one_gpu_type_starts_at_a_time():
    """Every node with a GPU-looking instance type is in the table; trials ask for {GPU: 1}, so
    two GPU types able to start workers would mix GPUs within one sweep."""
    cfg = cluster()
    types = gpu_node_types(cfg)
    for name, node in cfg["available_node_types"].items():
        if node["resources"].get("GPU"):
            assert name in types, f"{name}: {node['node_config']['InstanceType']} not in AWS_GPUS"
    startable = {gpu for gpu, _, node in types.values() if node.get("max_workers", 0) > 0}
    assert len(startable) == 1, startable


