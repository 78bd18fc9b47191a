"""Trial shapes -> placement-group bundles, and whether a shape can ever fit a cluster. Pure.

A trial with tensor parallel size TP and pipeline parallel size PP gets TP x PP bundles, one
per vLLM worker, placed with strategy PACK: Ray fills a node before spilling to the next, so TP
ranks share a node where they fit and pipeline stages may span nodes. Bundle 0 also holds the
server actor (the API server and engine core), hence its extra CPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from framework.specs import Scalar

Bundle = dict[str, float]


@dataclass(frozen=True)
class Shape:
    tp: int = 1
    pp: int = 1

    @property
    def world_size(self) -> int:
        return self.tp * self.pp


def shape_of(flags: Mapping[str, Scalar | None]) -> Shape:
    """TP and PP from the trial's vLLM flags (absent = 1)."""
    return Shape(tp=int(flags.get("tensor-parallel-size") or 1),
                 pp=int(flags.get("pipeline-parallel-size") or 1))


def bundles(shape: Shape, engine: str, cpus_per_worker: int) -> list[Bundle]:
    """One bundle per worker. GPU engine: {GPU: 1} (+1 CPU in bundle 0 for the server actor);
    CPU engine: {CPU: cpus_per_worker} (the server actor shares bundle 0's CPUs)."""
    if engine == "cpu":
        return [{"CPU": float(cpus_per_worker)} for _ in range(shape.world_size)]
    out: list[Bundle] = [{"GPU": 1.0} for _ in range(shape.world_size)]
    out[0] = {"GPU": 1.0, "CPU": 1.0}
    return out


def fits(wanted: Sequence[Bundle], nodes: Sequence[Mapping[str, float]]) -> bool:
    """Whether the bundles could be placed on nodes with these total resources (first-fit
    decreasing over nodes, as PACK would on an idle cluster)."""
    free = [dict(n) for n in nodes]
    for bundle in sorted(wanted, key=lambda b: -sum(b.values())):
        for node in free:
            if all(node.get(k, 0.0) >= v for k, v in bundle.items()):
                for k, v in bundle.items():
                    node[k] -= v
                break
        else:
            return False
    return True


def why_unplaceable(wanted: Sequence[Bundle], nodes: Sequence[Mapping[str, float]]) -> str:
    """A one-line reason naming the shortfall (call when `fits` is False)."""
    need: dict[str, float] = {}
    for b in wanted:
        for k, v in b.items():
            need[k] = need.get(k, 0.0) + v
    have = {k: sum(n.get(k, 0.0) for n in nodes) for k in need}
    parts = [f"{k} {need[k]:g} needed, {have[k]:g} in the cluster" for k in need]
    return (f"{len(wanted)} bundles {list(wanted)} cannot be placed on {len(nodes)} node(s): "
            + "; ".join(parts))


# Trials allowed to wait for placement at once. One waiting trial lets a large shape block the
# cluster while devices sit idle (head-of-line); a few let smaller trials backfill, while the
# study still never runs far ahead of the cluster. Beyond MAX_WAITING, a trial is asked for only
# while devices sit free that no waiting trial can use, up to MAX_BACKFILL waiting. Measured in
# docs/BENCHMARKS.md.
MAX_WAITING = 3
MAX_BACKFILL = 16


def ask_another(waiting: Sequence[int], free: float, max_waiting: int = MAX_WAITING,
                max_backfill: int = MAX_BACKFILL) -> bool:
    """Whether to ask the study for one more trial, given the device counts of the trials still
    waiting for placement and the devices no group holds: yes while len(waiting) < max_waiting;
    beyond that only while free >= 1 and every waiting trial needs more than `free` (so the free
    devices would sit idle), up to max_backfill waiting."""
    if len(waiting) < max_waiting:
        return True
    return len(waiting) < max_backfill and free >= 1 and min(waiting) > free
