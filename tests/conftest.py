"""Shared fixtures: the tiny model and a short temp dir; the order of test files, costliest
first, for pytest-xdist's lanes (tests/lanes.py). Helpers are in tests/*.py, one module per
what they serve: paths, procs (processes by marker), cli, clusters, engines, sweeps, streams,
leftovers, browser, isolated_nodes, ray_start, reservations, scheduling_math, storage_servers."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.lanes import costliest_first
from tests.lanes import cpu_shares
from tests.lanes import file_costs
from tests.lanes import next_scope
from tests.lanes import scope_of
from tests.paths import ROOT
from tests.paths import TINY_MODEL

# Every Ray the suite starts (emulated and `ray start` nodes, the product's private Rays; they
# inherit this environment) skips two costs nothing here uses (docs/BENCHMARKS.md, session 15):
# the idle Python workers a raylet prestarts for its first driver (each ~1 core-s to start and
# ~0.8 core-s a minute idle; the project's actors carry a runtime_env, so they never take one)
# and the dashboard agent's node report every 5 s (ray/dashboard/modules/reporter/
# reporter_consts.py; nothing here reads Ray's metrics). Ray's own knobs, set only if unset.
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
os.environ.setdefault("REPORTER_UPDATE_INTERVAL_MS", "60000")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Costliest files first (tests/lanes.py); within a file, pytest's order."""
    def file_of(item: pytest.Item) -> str:
        return Path(str(item.path)).relative_to(ROOT).as_posix()

    order = costliest_first([file_of(i) for i in items], file_costs())
    rank = {name: n for n, name in enumerate(order)}
    items.sort(key=lambda i: rank[file_of(i)])  # stable: a file's tests keep their order


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--wait-lanes", type=int, default=0, metavar="N",
                     help="of the -n lanes, the last N run the files that mostly wait, then "
                     "those that need the CPU least (tests/lanes.py next_scope); with --dist "
                     "loadfile")


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadfile`, except that a group of files (tests/lanes.py GROUPS) is one scope:
    xdist hands it whole to one lane, so the group's session fixture starts once; and with
    --wait-lanes N, the last N lanes take the waiting scopes, then those that need the CPU least,
    the others those first that are not waiting (tests/lanes.py next_scope)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    wait_lanes = config.getoption("wait_lanes")
    shares = cpu_shares(file_costs(), file_costs(column="cores")) if wait_lanes else {}

    class LaneScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid.split("::", 1)[0])

        def _is_wait_lane(self, node) -> bool:
            return int(node.gateway.id.removeprefix("gw")) >= self.numnodes - wait_lanes

        def _assign_work_unit(self, node) -> None:
            """xdist's, with the scope from next_scope; a lane with nothing to take ends."""
            scope = next_scope(list(self.workqueue), shares, self._is_wait_lane(node),
                               bool(wait_lanes))
            if scope is None:
                node.shutdown()
                return
            work_unit = self.workqueue.pop(scope)
            self.assigned_work.setdefault(node, {})[scope] = work_unit
            collection = self.registered_collections[node]
            node.send_runtest_some([collection.index(nodeid)
                                    for nodeid, completed in work_unit.items() if not completed])

    return LaneScheduling(config, log)


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    if not (TINY_MODEL / "config.json").is_file():
        pytest.fail(f"{TINY_MODEL} is missing: run `make model` (make test does it)")
    return TINY_MODEL


@pytest.fixture
def short_tmp():
    """A short temp dir (Ray's unix socket paths must stay under ~107 characters)."""
    path = Path(tempfile.mkdtemp(prefix="vst-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
