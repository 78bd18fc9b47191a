"""cluster.yaml against what it must fit, without starting anything: every GPU the shipped sweeps
name has a node type with that GPU and count, every GPU node type is a known AWS instance, and
only one GPU type can start workers; the file is one Ray 2.60 accepts (its schema, and its own
rules for network interfaces, run from its source); GPU nodes get one EFA interface per network
card, a root volume fast enough for model loading; every node requires IMDSv2 and names its
security group (Ray's default one would open SSH to the world); uv, vLLM and Ray are pinned,
vLLM and Ray to the installed versions. The token tests, which run the file's commands and a
loopback cluster, are in tests/e2e/test_cluster_yaml.py (they read the file through `cluster`)."""

from __future__ import annotations

import ast
import copy
import itertools
import re
import typing
from importlib.metadata import version
from pathlib import Path

import pytest
import ray
import yaml
from ray.autoscaler._private.util import validate_config

from framework.engine.feasibility import GPUS
from tests.paths import ROOT

CLUSTER = ROOT / "cluster.yaml"

# AWS instance type -> (GPU name as in framework.engine.feasibility.GPUS, GPUs per instance,
# network cards, each taking one EFA interface). Source: AWS's instance-type pages "Amazon EC2
# P4 Instances" (p4d.24xlarge: 8 x A100 40 GB; p4de.24xlarge: 8 x A100 80 GB; 400 Gbps EFA)
# and "Amazon EC2 P5 Instances" (p5.48xlarge: 8 x H100 80 GB; 3,200 Gbps EFA), and the EC2
# user guide's "Network cards" table (4 on P4d/P4de, 32 on P5).
AWS_GPUS: dict[str, tuple[str, int, int]] = {
    "p4d.24xlarge": ("A100-40GB", 8, 4),
    "p4de.24xlarge": ("A100-80GB", 8, 4),
    "p5.48xlarge": ("H100-80GB", 8, 32),
}
# gp3's limits (EC2 user guide, "General Purpose SSD volumes"): up to 16,000 IOPS at 500 IOPS
# per GiB, up to 1,000 MiB/s at 0.25 MiB/s per provisioned IOPS; 3,000 / 125 by default.
GP3_MAX_IOPS, GP3_MAX_THROUGHPUT = 16000, 1000


def cluster() -> dict:
    """cluster.yaml, parsed."""
    return yaml.safe_load(CLUSTER.read_text())


def gpu_node_types(cfg: dict) -> dict[str, tuple[str, int, dict]]:
    """Node type name -> (GPU name, GPUs per instance, node type) for every type with GPUs."""
    out = {}
    for name, node in cfg["available_node_types"].items():
        instance = node["node_config"]["InstanceType"]
        if instance in AWS_GPUS:
            out[name] = (*AWS_GPUS[instance][:2], node)
    return out


def ray_aws_functions(*names: str) -> dict[str, typing.Any]:
    """Functions of Ray 2.60's AWS cluster config (ray/autoscaler/_private/aws/config.py), taken
    from its source: the module imports boto3, which this project does not install."""
    source = Path(ray.__file__).parent / "autoscaler" / "_private" / "aws" / "config.py"
    tree = ast.parse(source.read_text(encoding="utf-8"))
    module = ast.Module([node for node in tree.body if isinstance(node, ast.FunctionDef)
                         and node.name in names], type_ignores=[])
    namespace: dict[str, typing.Any] = {"copy": copy, "itertools": itertools,
                                        **{n: getattr(typing, n) for n in typing.__all__}}
    exec(compile(module, str(source), "exec"), namespace)  # Ray's own code, unchanged
    assert set(names) <= set(namespace), names
    return namespace


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




def test_ray_accepts_the_file():
    """Ray's schema (what `ray up` checks first), and its rule for node types with network
    interfaces: subnet and groups given in each interface only, copied up by Ray."""
    cfg = cluster()
    validate_config(cfg)
    ray_nic = ray_aws_functions("_configure_node_type_from_network_interface",
                                "_configure_subnets_and_groups_from_network_interfaces",
                                "_subnets_in_network_config",
                                "_security_groups_in_network_config")
    for name, node in cfg["available_node_types"].items():
        done = ray_nic["_configure_node_type_from_network_interface"](node)["node_config"]
        if "NetworkInterfaces" in done:  # Ray raises ValueError on a misplaced subnet or group
            assert done["SubnetIds"] and done["SecurityGroupIds"], name  # as Ray launches it
    assert "security_group" not in cfg["provider"]


@pytest.mark.parametrize("instance", sorted(AWS_GPUS))
def test_a_gpu_node_gets_one_efa_interface_per_network_card_in_one_subnet(instance):
    """AWS's layout for instances with several network cards: card 0 at device index 0, each
    further card at device index 1; EFA's OS-bypass traffic stays inside one subnet, so every
    interface of every GPU node type names the same one, and the same group."""
    cfg = cluster()
    nodes = [node["node_config"] for node in cfg["available_node_types"].values()
             if node["node_config"]["InstanceType"] == instance]
    head = cfg["available_node_types"][cfg["head_node_type"]]["node_config"]
    for node in nodes:
        nics = node["NetworkInterfaces"]
        assert [n["NetworkCardIndex"] for n in nics] == list(range(AWS_GPUS[instance][2]))
        assert [n["DeviceIndex"] for n in nics] == [0] + [1] * (len(nics) - 1)
        assert {n["InterfaceType"] for n in nics} == {"efa"}
        assert {n["SubnetId"] for n in nics} == set(head["SubnetIds"])
        assert all(n["Groups"] == head["SecurityGroupIds"] and n["DeleteOnTermination"]
                   for n in nics)


def test_a_gpu_node_reads_weights_from_a_provisioned_gp3_volume():
    for name, (_, _, node) in gpu_node_types(cluster()).items():
        for mapping in node["node_config"]["BlockDeviceMappings"]:
            ebs = mapping["Ebs"]
            assert ebs["VolumeType"] == "gp3", name
            assert (ebs["Iops"], ebs["Throughput"]) == (GP3_MAX_IOPS, GP3_MAX_THROUGHPUT), name
            assert ebs["Iops"] <= 500 * ebs["VolumeSize"], name
            assert ebs["Throughput"] <= 0.25 * ebs["Iops"], name


def test_every_node_requires_imdsv2_and_names_its_security_group():
    """Ray creates its default security group, SSH from 0.0.0.0/0, for any node type that names
    none (config.py, _configure_security_group, _create_default_ssh_inbound_rules)."""
    default_ssh = ray_aws_functions("_create_default_ssh_inbound_rules")[
        "_create_default_ssh_inbound_rules"]()
    assert default_ssh[0]["IpRanges"] == [{"CidrIp": "0.0.0.0/0"}]  # why every type names one
    cfg = cluster()
    for name, node in cfg["available_node_types"].items():
        conf = node["node_config"]
        assert conf["MetadataOptions"]["HttpTokens"] == "required", name
        assert conf["MetadataOptions"]["HttpEndpoint"] == "enabled", name
        groups = conf.get("SecurityGroupIds") or [g for nic in conf.get("NetworkInterfaces", [])
                                                 for g in nic["Groups"]]
        assert groups, name
    assert "0.0.0.0/0" not in yaml.safe_dump(cfg)
    assert cfg["provider"]["use_internal_ips"] is True  # a private subnet: see the file's "Network"


def test_uv_vllm_and_ray_are_pinned_to_the_versions_this_project_runs():
    commands = " ".join(cluster()["setup_commands"])
    pins = dict(re.findall(r"\b(uv|vllm|ray\[default\])==([0-9][^\s\"']*)", commands))
    assert set(pins) == {"uv", "vllm", "ray[default]"}, commands
    assert pins["vllm"] == version("vllm").split("+")[0]  # the CPU build here: 0.32.0+cpu
    assert pins["ray[default]"] == version("ray")
    assert re.fullmatch(r"\d+\.\d+\.\d+", pins["uv"])
