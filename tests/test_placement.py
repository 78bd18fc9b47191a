"""Trial shapes -> bundles, and the can-it-ever-fit check (pure)."""

from __future__ import annotations

import pytest

from framework.placement import Shape, ask_another, bundles, fits, shape_of, why_unplaceable


@pytest.mark.parametrize("flags, shape", [
    ({}, Shape(1, 1)),
    ({"tensor-parallel-size": 4}, Shape(4, 1)),
    ({"tensor-parallel-size": 2, "pipeline-parallel-size": 4}, Shape(2, 4)),
    ({"pipeline-parallel-size": None}, Shape(1, 1)),
])
def test_shape_of_flags(flags, shape):
    assert shape_of(flags) == shape
    assert shape.world_size == shape.tp * shape.pp


def test_gpu_bundles_one_per_worker_with_the_server_cpu_in_bundle_0():
    got = bundles(Shape(2, 2), "gpu", cpus_per_worker=3)
    assert got == [{"GPU": 1.0, "CPU": 1.0}, {"GPU": 1.0}, {"GPU": 1.0}, {"GPU": 1.0}]


def test_cpu_bundles_hold_cpus_only():
    assert bundles(Shape(1, 2), "cpu", cpus_per_worker=3) == [{"CPU": 3.0}, {"CPU": 3.0}]


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
