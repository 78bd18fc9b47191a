"""Trial shapes -> bundles, and the can-it-ever-fit check (pure)."""

from __future__ import annotations

import pytest

from framework.cluster.placement import NODE_ID_LABEL
from framework.cluster.placement import Layout
from framework.cluster.placement import Shape
from framework.cluster.placement import ask_another
from framework.cluster.placement import assign_units
from framework.cluster.placement import bundles
from framework.cluster.placement import fits
from framework.cluster.placement import layout
from framework.cluster.placement import node_unit
from framework.cluster.placement import ranks_by_node
from framework.cluster.placement import shape_of
from framework.cluster.placement import why_unplaceable


@pytest.mark.parametrize("flags, shape", [
    ({}, Shape(1, 1)),
    ({"tensor-parallel-size": 4}, Shape(4, 1)),
    ({"tensor-parallel-size": 2, "pipeline-parallel-size": 4}, Shape(2, 4)),
    ({"pipeline-parallel-size": None}, Shape(1, 1)),
    ({"data-parallel-size": 2}, Shape(1, 1, 2)),
    ({"tensor-parallel-size": 2, "data-parallel-size": 4}, Shape(2, 1, 4)),
])
def test_shape_of_flags(flags, shape):
    assert shape_of(flags) == shape
    assert shape.world_size == shape.tp * shape.pp  # one engine's (vLLM's world size)
    assert shape.devices == shape.tp * shape.pp * shape.dp


@pytest.mark.parametrize("shape, label", [
    (Shape(1, 1), "TP1xPP1"), (Shape(2, 4), "TP2xPP4"), (Shape(1, 1, 2), "TP1xPP1xDP2"),
])
def test_shape_label(shape, label):
    assert shape.label == label


def test_gpu_bundles_one_per_worker_with_the_server_cpu_in_bundle_0():
    got = bundles(Shape(2, 2), "gpu", cpus_per_worker=3)
    assert got == [{"GPU": 1.0, "CPU": 1.0}, {"GPU": 1.0}, {"GPU": 1.0}, {"GPU": 1.0}]


def test_cpu_bundles_hold_cpus_only():
    assert bundles(Shape(1, 2), "cpu", cpus_per_worker=3) == [{"CPU": 3.0}, {"CPU": 3.0}]


def test_data_parallel_bundles_one_per_engine():
    assert bundles(Shape(1, 1, 3), "cpu", cpus_per_worker=2) == [{"CPU": 2.0}] * 3


EIGHT_GPU_NODE = {"GPU": 8.0, "CPU": 8.0}


@pytest.mark.parametrize("shape, nodes, expected", [
    (Shape(8, 1), [EIGHT_GPU_NODE], True),
    (Shape(8, 2), [EIGHT_GPU_NODE], False),            # 16 GPUs on one 8-GPU node
    (Shape(8, 2), [EIGHT_GPU_NODE, EIGHT_GPU_NODE], True),  # PP across two nodes
    (Shape(8, 8), [EIGHT_GPU_NODE] * 4, False),        # 64 > 32
    (Shape(1, 1), [{"CPU": 4.0}], False),              # no GPU at all
    (Shape(2, 1), [{"GPU": 1.0, "CPU": 1.0}, {"GPU": 1.0}], True),
    (Shape(2, 1), [{"GPU": 1.0}, {"GPU": 1.0}], False),  # bundle 0 needs a CPU beside its GPU
])
def test_fits_gpu_shapes(shape, nodes, expected):
    assert fits(bundles(shape, "gpu", 1), nodes) is expected


def test_fits_packs_largest_bundle_first():
    wanted = [{"CPU": 1.0}, {"CPU": 3.0}]
    assert fits(wanted, [{"CPU": 3.0}, {"CPU": 1.0}])


def test_why_unplaceable_names_the_shortfall():
    text = why_unplaceable(bundles(Shape(8, 8), "gpu", 1), [EIGHT_GPU_NODE] * 4)
    assert "GPU 64 needed, 32 in the cluster" in text and "64 bundles" in text


@pytest.mark.parametrize("waiting, free, expected", [
    ([], 0, True),                    # nothing waits: ask
    ([32, 32], 0, True),              # fewer than MAX_WAITING wait: ask even on a full cluster
    ([32, 16, 8], 0, False),          # MAX_WAITING wait and nothing is free
    ([32, 16, 8], 4, True),           # 4 free devices none of them can use: backfill
    ([32, 16, 4], 4, False),          # the 4-device trial will take them
    ([32, 16, 8], 0.5, False),        # less than one device free
    ([32] * 15, 8, True),             # still under MAX_BACKFILL
    ([32] * 16, 8, False),            # MAX_BACKFILL wait: the study stops running ahead
])
def test_ask_another(waiting, free, expected):
    assert ask_another(waiting, free, max_waiting=3, max_backfill=16) is expected


@pytest.mark.parametrize("shape, unit", [
    (Shape(1, 1), 1), (Shape(4, 1), 4), (Shape(8, 1), 8),  # PP = 1: the whole group
    (Shape(1, 4), 1), (Shape(2, 2), 2), (Shape(8, 2), 8),  # PP > 1: one stage
    (Shape(1, 1, 2), 2), (Shape(1, 1, 4), 4),  # DP engines: on the server's node
])
def test_node_unit_is_the_group_without_pp_else_one_stage(shape, unit):
    assert node_unit(shape) == unit


GPU = {"GPU": 1.0}


@pytest.mark.parametrize("wanted, unit, nodes, expected", [
    # two stages of TP=2 on a 4-GPU node and a 2-GPU node: best fit puts stage 0 (largest
    # first, ties in order) on the 2-GPU node, leaving the 4-GPU node whole for stage 1
    ([GPU] * 4, 2, {"a": {"GPU": 4.0}, "b": {"GPU": 2.0}}, ["b", "b", "a", "a"]),
    # both stages fit one node: they share it
    ([GPU] * 4, 2, {"a": {"GPU": 4.0}}, ["a", "a", "a", "a"]),
    # 3 free GPUs on each of two nodes: 6 free in all, but no node takes a stage of 4
    ([GPU] * 8, 4, {"a": {"GPU": 3.0}, "b": {"GPU": 3.0}}, None),
    # TP=2 stages may not split 1 + 1 across nodes
    ([GPU] * 2, 2, {"a": {"GPU": 1.0}, "b": {"GPU": 1.0}}, None),
    # units of one bundle go anywhere
    ([GPU] * 2, 1, {"a": {"GPU": 1.0}, "b": {"GPU": 1.0}}, ["a", "b"]),
    # memory and node:ip resources do not sway the fit: only what the bundle asks for counts
    ([GPU] * 2, 2, {"a": {"GPU": 8.0, "memory": 1e12}, "b": {"GPU": 2.0, "memory": 1.0}},
     ["b", "b"]),
])
def test_assign_units_keeps_each_unit_on_one_node(wanted, unit, nodes, expected):
    assert assign_units(wanted, unit, nodes) == expected


def test_fits_refuses_a_stage_split_across_nodes():
    four_nodes_of_two = [{"GPU": 2.0, "CPU": 2.0}] * 4
    wanted = bundles(Shape(4, 2), "gpu", 1)
    assert fits(wanted, four_nodes_of_two, unit=1)  # 8 GPUs exist ...
    assert not fits(wanted, four_nodes_of_two, unit=node_unit(Shape(4, 2)))  # ... not 4 on a node
    why = why_unplaceable(wanted, four_nodes_of_two, unit=4)
    assert "4 bundles must share a node" in why and "largest: 2" in why


def test_layout_strategies():
    free = {"a": {"GPU": 4.0}, "b": {"GPU": 4.0}}
    assert layout([GPU] * 4, 4, free, free) == Layout("STRICT_PACK")
    assert layout([GPU] * 4, 1, free, free) == Layout("PACK")
    pinned = layout([GPU] * 4, 2, {"a": {"GPU": 2.0}, "b": {"GPU": 2.0}}, free)
    assert pinned.strategy == "PACK"
    assert pinned.label_selector == ({NODE_ID_LABEL: "a"},) * 2 + ({NODE_ID_LABEL: "b"},) * 2


def test_layout_waits_on_total_resources_when_nothing_is_free():
    busy = {"a": {"GPU": 0.0}, "b": {"GPU": 1.0}}
    total = {"a": {"GPU": 4.0}, "b": {"GPU": 4.0}}
    plan = layout([GPU] * 4, 2, busy, total)
    assert plan.label_selector is not None
    nodes = [s[NODE_ID_LABEL] for s in plan.label_selector]
    assert nodes[0] == nodes[1] and nodes[2] == nodes[3]


@pytest.mark.parametrize("bundle_nodes, driver, ranks", [
    # vLLM's own docstring example (vllm/v1/executor/ray_utils.py get_bundles_sorted_by_node):
    # bundles on C, A, B, C, A, B with the driver on A -> order 1, 4, 2, 5, 0, 3
    (["C", "A", "B", "C", "A", "B"], "A", [4, 0, 2, 5, 1, 3]),
    (["n2", "n1", "n1", "n2"], "n2", [0, 2, 3, 1]),
    (["x"], "y", [0]),
])
def test_ranks_by_node_follow_vllm_driver_first_then_node_id(bundle_nodes, driver, ranks):
    assert ranks_by_node(bundle_nodes, driver) == ranks



TWO_BY_EIGHT = {"a": {"GPU": 8.0, "CPU": 8.0}, "b": {"GPU": 8.0, "CPU": 8.0}}
ONE_FREE_EACH = {"a": {"GPU": 1.0, "CPU": 8.0}, "b": {"GPU": 1.0, "CPU": 8.0}}
A, B = {NODE_ID_LABEL: "a"}, {NODE_ID_LABEL: "b"}


@pytest.mark.parametrize("shape, free, plan", [
    # #32 defect 3: PP = 2 x TP = 1 is two units of one bundle: PACK, no node named, whatever
    # is free; Ray fills the node with the most room first, so the stages share a node that
    # has two GPUs free and span two only when none has (placement's docstring;
    # tests/e2e/test_gpu_devices.py checks both on a real Ray)
    (Shape(1, 2), TWO_BY_EIGHT, Layout("PACK")),
    (Shape(1, 2), {"a": {"GPU": 8.0, "CPU": 8.0}, "b": {"GPU": 1.0, "CPU": 8.0}}, Layout("PACK")),
    (Shape(1, 2), ONE_FREE_EACH, Layout("PACK")),
    # the other shapes on the same cluster, for contrast
    (Shape(2, 1), TWO_BY_EIGHT, Layout("STRICT_PACK")),
    (Shape(2, 2), TWO_BY_EIGHT, Layout("PACK", (A,) * 4)),       # best fit: both stages on a
    (Shape(8, 2), TWO_BY_EIGHT, Layout("PACK", (A,) * 8 + (B,) * 8)),  # one stage per node
    (Shape(2, 2), ONE_FREE_EACH, Layout("PACK", (A,) * 4)),      # waits on a (total resources)
])
def test_layouts_on_two_nodes_of_8(shape, free, plan):
    wanted, unit = bundles(shape, "gpu", 1), node_unit(shape)
    assert fits(wanted, list(TWO_BY_EIGHT.values()), unit)
    assert layout(wanted, unit, free, TWO_BY_EIGHT) == plan


AWAY_FROM_A = {NODE_ID_LABEL: "!in(a)"}


@pytest.mark.parametrize("shape, free, total, plan", [
    # a decode server avoiding its prefill server's node a: every bundle kept off a
    (Shape(1, 1), TWO_BY_EIGHT, TWO_BY_EIGHT, Layout("STRICT_PACK", (AWAY_FROM_A,))),
    (Shape(1, 2), TWO_BY_EIGHT, TWO_BY_EIGHT, Layout("PACK", (AWAY_FROM_A,) * 2)),
    # pinned stages: chosen among the other nodes
    (Shape(2, 2), TWO_BY_EIGHT, TWO_BY_EIGHT, Layout("PACK", (B,) * 4)),
    # b is busy now but could hold it: still away from a (the group waits for b)
    (Shape(1, 1), {"a": {"GPU": 8.0, "CPU": 8.0}, "b": {"GPU": 0.0, "CPU": 8.0}}, TWO_BY_EIGHT,
     Layout("STRICT_PACK", (AWAY_FROM_A,))),
    # b could never hold it: the preference is dropped (laid out as without it)
    (Shape(1, 1), TWO_BY_EIGHT, {"a": {"GPU": 8.0, "CPU": 8.0}, "b": {"CPU": 8.0}},
     Layout("STRICT_PACK")),
])
def test_a_group_avoids_the_nodes_it_is_asked_to_where_the_others_could_hold_it(
        shape, free, total, plan):
    wanted, unit = bundles(shape, "gpu", 1), node_unit(shape)
    assert layout(wanted, unit, free, total, avoid=["a"]) == plan
