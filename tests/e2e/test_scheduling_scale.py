"""Scheduling with fakes: SCALE_TRIALS trials (default 12) of mixed TP/PP shapes served by
FakeEngine on an emulated cluster of SCALE_CLUSTER (`NODESxGPUS`, default 2x2: 4 fake GPUs).
The large version is benchmarks/scheduling.py: it runs this test at 4x8 (32 fake GPUs) with
40 trials and holds the busy fraction it prints to its target.

The bugs it guards, and why 2x2 is the smallest cluster that still fails on each:
- a device given to two trials at once (4 devices, trials of 1, 2 and 4 ranks contend for them);
- a rank outside its trial's group, or on another node than its bundle (a PP 2 group spans
  both nodes: one node could not show it);
- a shape that can never fit launched or waited for, of both kinds: TP 4 or 8 wider than a
  2-GPU node though TP 4 <= 4 devices (a stage's TP ranks share a node), and PP 16 beyond all
  4 devices;
- a trial that never ends;
- head-of-line blocking: one trial waiting at a time while devices sit idle
  (placement.MAX_WAITING), asserted as several trials waiting for placement at once.
The space ({1,2,4,8} TP x {1,2,16} PP, seed 5) and SCALE_TRIALS 12 place 7 trials of world
sizes 1, 2 and 4 on 2x2, 18 placeholder workers (the test asserts at least three sizes and
that some never fit).
The cost is the Ray worker processes that FakeEngine's placeholder workers start (one per
rank), not the trials (docs/BENCHMARKS.md). FakeEngine is a named stand-in
(framework/engine/fake_engine.py and the engine contract tests). Asserted from the per-device
occupancy log that FakeEngine's placeholder workers write (and the launcher, when it releases a
trial's group). Prints the busy fraction while trials were queued: devices held by placed
groups (placement to release, start-up and teardown included) over all devices, per waiting
trial and at any waiting moment; benchmarks/scheduling.py reads those lines and holds them to
the target (docs/BENCHMARKS.md): a fraction moves with the machine's load, so it is no test's
assertion. The interval arithmetic and SCALE_CLUSTER's parsing are tests/scheduling_math.py,
checked by hand in tests/unit/test_scheduling_math.py.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict

import pytest
import yaml

from tests.cli import cli_joined
from tests.clusters import emulated_cluster
from tests.scheduling_math import SCALE_VAR
from tests.scheduling_math import busy_fraction_while_queued
from tests.scheduling_math import cluster_shape
from tests.scheduling_math import merged
from tests.scheduling_math import most_waiting_at_once
from tests.sweeps import NO_REMEASURE
from tests.sweeps import occupancy_events
from tests.sweeps import read_trials

pytestmark = pytest.mark.server


(NODES, GPUS_PER_NODE) = cluster_shape(os.environ.get(SCALE_VAR) or "2x2")
TRIALS = int(os.environ.get("SCALE_TRIALS") or 12)
# FakeEngine's start-up (s), TPOT (ms) and prompts per trial: benchmarks/scheduling.py's (set
# SCALE_CLUSTER) keep its figures comparable run to run; the test's own are faster, since no
# bug it guards needs a trial to last (only that trials overlap, which placement makes them)
STARTUP_S, TPOT_MS, PROMPTS = ("3", "20", 32) if os.environ.get(SCALE_VAR) else ("1", "5", 16)


@pytest.fixture
def gpu_cluster(short_tmp):
    nodes = [{"num_cpus": 1, "num_gpus": 0}] + [
        {"num_cpus": GPUS_PER_NODE, "num_gpus": GPUS_PER_NODE, "node_ip_address": f"127.0.0.{i + 2}"}
        for i in range(NODES)]
    with emulated_cluster(short_tmp, nodes) as (_, address, marker):
        yield address, marker


@pytest.mark.timeout(900)
def test_mixed_trials_on_fake_gpus(tiny_model, short_tmp, gpu_cluster):
    address, marker = gpu_cluster
    occupancy = short_tmp / "occupancy.jsonl"
    space = short_tmp / "space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        "tensor-parallel-size": {"type": "categorical", "choices": [1, 2, 4, 8]},
        "pipeline-parallel-size": {"type": "categorical", "choices": [1, 2, 16]},
        "max-num-seqs": {"type": "categorical", "choices": [4, 64]},
    }}))
    sweep = short_tmp / "scale.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "scale", "model": str(tiny_model), "search_space": str(space), "engine": "fake",
        # reuse off: every trial places its own group (reuse: tests/{unit,e2e}/test_server_reuse.py)
        "server": {"host": "node", "startup_timeout_s": 300, "reuse": False,
                   "env": {"FAKE_ENGINE_STARTUP_S": STARTUP_S, "FAKE_ENGINE_TTFT_MS": "30",
                           "FAKE_ENGINE_TPOT_MS": TPOT_MS,
                           "FAKE_ENGINE_OCCUPANCY_LOG": str(occupancy)}},
        "workload": {"num_prompts": PROMPTS, "input_len": 16, "output_len": 24, "max_concurrency": 8,
                     "warmup_requests": 0},
        "sla": {"p99_ttft_ms": 5000},
        "search": {**NO_REMEASURE, "sampler": "random", "n_trials": TRIALS, "baseline": False, "seed": 5},
        "cluster": {"address": address},
        "results_dir": str(short_tmp / "results"),
    }))
    res = cli_joined(["run", str(sweep)], short_tmp, marker, short_tmp)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]

    trials = read_trials(short_tmp / "results", "scale")
    assert len(trials) == TRIALS and set(trials["trial_number"]) == set(range(TRIALS))
    shapes = trials["param_tensor_parallel_size"] * trials["param_pipeline_parallel_size"]
    # more ranks than devices, or a stage's TP ranks (which share a node) wider than a node
    never_fit = (shapes > NODES * GPUS_PER_NODE) | (trials["param_tensor_parallel_size"] > GPUS_PER_NODE)
    assert never_fit.any(), "the space should propose shapes that can never fit"
    assert (trials[never_fit]["fail_reason"] == "unplaceable").all()
    assert trials[never_fit]["placement"].map(len).eq(0).all()  # never launched
    placed = trials[~never_fit]
    not_complete = placed[placed["state"] != "COMPLETE"]
    # a str: pytest cuts a non-str assertion message to 240 characters
    assert not_complete.empty, "\n".join(json.dumps(r, default=str) for r in not_complete[
        ["trial_number", "state", "fail_reason", "fail_detail", "placement_wait_s", "startup_s",
         "trial_s", "log_tail"]].to_dict("records"))
    assert len(set(shapes[~never_fit])) >= 3, "the sweep should mix several shapes"

    released, by_trial = occupancy_events(occupancy)
    intervals: dict[tuple[str, str], list[tuple[float, float, int]]] = defaultdict(list)
    reserved: list[tuple[float, float]] = []  # one interval per device a placed group holds
    until_measured: list[tuple[float, float]] = []  # the same, ending when the load ended
    for _, row in placed.iterrows():
        number = int(row["trial_number"])
        # the processes holding the trial's devices: its server at world size 1, else its workers
        evs = [e for e in by_trial[number] if e["bundle"] is not None]
        world = int(row["param_tensor_parallel_size"] * row["param_pipeline_parallel_size"])
        assert sorted(e["bundle"] for e in evs) == list(range(world)), number
        assert all(e["in_group"] for e in evs) and len({e["group"] for e in evs}) == 1
        assert [e["node_ip"] for e in sorted(evs, key=lambda e: e["bundle"])] == list(row["placement"])
        # the group holds its devices until the background stop releases it
        end = released[evs[0]["group"]]
        assert end >= row["started_at"].timestamp() + row["trial_s"] - 1.0, number
        for e in evs:
            assert len(e["gpu_ids"]) == 1
            intervals[(e["node_ip"], e["gpu_ids"][0])].append((e["t"], end, number))
        placed_at = row["started_at"].timestamp() + row["placement_wait_s"]
        reserved += [(placed_at, end)] * world
        until_measured += [(placed_at, row["started_at"].timestamp() + row["trial_s"])] * world
    for device, spans in intervals.items():
        spans.sort()
        for (_s0, e0, n0), (s1, _, n1) in zip(spans, spans[1:]):
            assert s1 >= e0, f"device {device} given to trial {n1} while trial {n0} held it"
    queued = [(r["started_at"].timestamp(), r["started_at"].timestamp() + r["placement_wait_s"])
              for _, r in placed.iterrows() if r["placement_wait_s"] and r["placement_wait_s"] > 0]
    fraction = busy_fraction_while_queued(reserved, queued, NODES * GPUS_PER_NODE)
    print(f"\n(ending each trial's hold at the end of its load instead of at release: "
          f"{busy_fraction_while_queued(until_measured, queued, NODES * GPUS_PER_NODE):.1%})")
    anyone = merged(queued)
    print(f"(while any trial was queued, each moment counted once: "
          f"{busy_fraction_while_queued(reserved, anyone, NODES * GPUS_PER_NODE):.1%} over "
          f"{sum(b - a for a, b in anyone):.0f} s)")
    print(f"busy fraction while trials were queued: {fraction:.1%} over "
          f"{sum(b - a for a, b in queued):.0f} s of queueing; {len(placed)} trials placed")
    worlds = shapes[~never_fit]
    print(f"({int(worlds[worlds > 1].sum())} placeholder workers started, one Ray worker process "
          f"each, on {NODES} nodes x {GPUS_PER_NODE} fake GPUs)")
    assert queued, "the cluster never filled up: the test did not exercise queueing"
    # No head-of-line blocking: several trials waited for placement at the same moment (one at
    # a time let a large shape idle the cluster: 79-83% busy, docs/BENCHMARKS.md). The busy
    # fraction itself is held to its target by benchmarks/scheduling.py.
    assert most_waiting_at_once(queued) >= 2, queued

