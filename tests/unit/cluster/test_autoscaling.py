"""The nodes an autoscaling cluster can still add (framework/cluster/autoscaling.py): node types
read from a `ray up` config and from Ray's ClusterConfig proto, running counts from the
autoscaler's status record, and the nodes a trial may wait for."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from ray.core.generated import autoscaler_pb2

from framework.cluster.autoscaling import UNLIMITED
from framework.cluster.autoscaling import AutoscalingConfigError
from framework.cluster.autoscaling import NodeType
from framework.cluster.autoscaling import ScaleUp
from framework.cluster.autoscaling import find_scale_up
from framework.cluster.autoscaling import from_cluster_config
from framework.cluster.autoscaling import parse_config
from framework.cluster.autoscaling import possible_nodes
from framework.cluster.autoscaling import read_config
from framework.cluster.autoscaling import running_counts
from framework.cluster.placement import Shape
from framework.cluster.placement import bundles
from framework.cluster.placement import fits

ROOT = Path(__file__).resolve().parents[3]
GPU2 = NodeType("gpu2", {"CPU": 4.0, "GPU": 2.0}, 2)
GPU8 = NodeType("gpu8", {"CPU": 96.0, "GPU": 8.0}, 1)
HEAD = [{"CPU": 2.0}]


@pytest.mark.parametrize(("scale", "running", "added"), [
    (None, {}, []),
    (ScaleUp((GPU2,), None, "t"), {}, [GPU2.resources] * 2),
    (ScaleUp((GPU2,), None, "t"), {"gpu2": 1}, [GPU2.resources]),
    (ScaleUp((GPU2,), None, "t"), {"gpu2": 3}, []),  # more than its max: none, never negative
    (ScaleUp((GPU2, GPU8), None, "t"), {}, [GPU2.resources] * 2 + [GPU8.resources]),
    (ScaleUp((GPU2, GPU8), 2, "t"), {}, [GPU2.resources] * 2),  # the cluster-wide cap
    (ScaleUp((GPU2, GPU8), 2, "t"), {"gpu2": 1}, [GPU2.resources]),
    (ScaleUp((GPU2, GPU8), 2, "t"), {"gpu2": 2}, []),
])
def test_possible_nodes_are_the_alive_then_what_each_type_may_still_add(scale, running, added):
    assert possible_nodes(HEAD, scale, running) == HEAD + added


def test_a_shape_that_fits_only_an_addable_node_fits_the_possible_nodes():
    """Defect 6: on a head without GPUs, a TP = 2 trial fits nothing alive, and fits once the
    node type the autoscaler may add is counted."""
    wanted = bundles(Shape(tp=2, pp=1), "gpu", 1)
    scale = ScaleUp((GPU2,), None, "t")
    assert not fits(wanted, HEAD, 2)
    assert fits(wanted, possible_nodes(HEAD, scale, {}), 2)
    assert not fits(bundles(Shape(tp=4, pp=1), "gpu", 1), possible_nodes(HEAD, scale, {}), 4)


def test_the_repository_cluster_yaml_reads_as_its_worker_node_types():
    scale = read_config(ROOT / "cluster.yaml")
    config = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    workers = {k: v for k, v in config["available_node_types"].items()
               if k != config["head_node_type"]}
    assert [t.name for t in scale.types] == list(workers)
    for node_type in scale.types:
        declared = workers[node_type.name]
        assert node_type.max_workers == declared["max_workers"]
        assert node_type.resources["GPU"] == declared["resources"]["GPU"]
        assert node_type.resources["CPU"] == math.inf  # filled in by AWS at launch
    assert scale.max_workers == config["max_workers"]


@pytest.mark.parametrize(("config", "key"), [
    ({}, "available_node_types"),
    ({"available_node_types": {"w": []}}, "available_node_types.w"),
    ({"available_node_types": {"w": {"resources": {"GPU": "eight"}, "max_workers": 1}}},
     "available_node_types.w.resources"),
    ({"available_node_types": {"w": {"resources": {"GPU": 8}, "max_workers": -1}}},
     "available_node_types.w.max_workers"),
])
def test_a_malformed_config_is_one_line_naming_the_file_and_key(config, key):
    with pytest.raises(AutoscalingConfigError) as err:
        parse_config(config, "c.yaml")
    assert str(err.value).startswith(f"c.yaml: {key}") and "\n" not in str(err.value)


def test_an_unreadable_config_names_the_file(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("a: [")
    with pytest.raises(AutoscalingConfigError, match=f"^{bad}: cannot be read"):
        read_config(bad)


def test_max_workers_defaults_to_the_cluster_wide_value_and_the_head_type_is_left_out():
    scale = parse_config({"max_workers": 3, "head_node_type": "h", "available_node_types": {
        "h": {"resources": {"CPU": 8}}, "w": {"resources": {"CPU": 2, "GPU": 1}}}}, "c")
    assert scale == ScaleUp((NodeType("w", {"CPU": 2.0, "GPU": 1.0}, 3),), 3, "c")


def test_rays_cluster_config_proto_reads_as_node_types():
    config = autoscaler_pb2.ClusterConfig(node_group_configs=[
        autoscaler_pb2.NodeGroupConfig(name="gpu", resources={"GPU": 8, "CPU": 96}, max_count=2),
        autoscaler_pb2.NodeGroupConfig(name="any", resources={"CPU": 4}, max_count=-1),
        autoscaler_pb2.NodeGroupConfig(name="off", resources={"CPU": 4}, max_count=0)])
    scale = from_cluster_config(config.node_group_configs)
    assert scale.types == (NodeType("gpu", {"GPU": 8.0, "CPU": 96.0}, 2),
                           NodeType("any", {"CPU": 4.0}, UNLIMITED))


def test_running_counts_read_the_autoscalers_active_and_idle_nodes():
    status = {"autoscaler_report": {"active_nodes": {"gpu2": 1, "ray.head.default": 1},
                                    "idle_nodes": {"gpu2": 1}, "pending_launches": {"gpu2": 1}}}
    assert running_counts(status) == {"gpu2": 2, "ray.head.default": 1}
    assert running_counts(None) == {} == running_counts({"autoscaler_report": {
        "active_nodes": None, "idle_nodes": None}})


def test_a_private_local_ray_has_no_autoscaler_unless_a_config_is_named(tmp_path):
    assert find_scale_up(None, joined=False) is None
    named = tmp_path / "c.yaml"
    named.write_text(yaml.safe_dump({"available_node_types": {"w": {"resources": {"GPU": 1},
                                                                     "max_workers": 1}}}))
    assert find_scale_up(named, joined=False).types[0].name == "w"
