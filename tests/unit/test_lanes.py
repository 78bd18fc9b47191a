"""The lane order of `make test` (tests/lanes.py), its wait lanes' scopes, and the per-file
seconds and core-seconds it reads (benchmarks/suite_durations.py, tests/durations.json)."""

from __future__ import annotations

import json
import textwrap

import pytest

from benchmarks.suite_durations import cores_per_file
from benchmarks.suite_durations import seconds_per_file
from tests import lanes
from tests.lanes import NEW_FILE_S
from tests.lanes import WAIT_LANE_MAX_SHARE
from tests.lanes import WAITING_MIN_S
from tests.lanes import WAITING_SHARE
from tests.lanes import costliest_first
from tests.lanes import cpu_shares
from tests.lanes import file_costs
from tests.lanes import next_scope
from tests.lanes import waiting_scopes
from tests.paths import ROOT

COSTS = {"e2e/a.py": 200.0, "e2e/b.py": 50.0, "unit/c.py": 1.0}


@pytest.mark.parametrize(("files", "expected"), [
    (["unit/c.py", "e2e/b.py", "e2e/a.py"], ["e2e/a.py", "e2e/b.py", "unit/c.py"]),
    # a file collected again (its tests interleaved with others) is placed once
    (["e2e/b.py", "e2e/a.py", "e2e/b.py"], ["e2e/a.py", "e2e/b.py"]),
    # a file the table lacks counts NEW_FILE_S: between 50 s and 1 s here
    (["unit/c.py", "e2e/new.py", "e2e/b.py"], ["e2e/b.py", "e2e/new.py", "unit/c.py"]),
    # equal costs keep the collection order, the same in every lane
    (["e2e/new2.py", "e2e/new1.py"], ["e2e/new2.py", "e2e/new1.py"]),
])
def test_costliest_first(files, expected):
    assert NEW_FILE_S < 50.0
    assert costliest_first(files, COSTS) == expected


def test_a_group_is_placed_whole_at_the_sum_of_its_files(monkeypatch):
    """Two files of 50 s and 1 s in one group rank as one scope of 51 s,
    before a file of 50 s and after one of 200 s, together, in first-seen order."""
    monkeypatch.setattr(lanes, "GROUPS", {"g": ("unit/c.py", "e2e/b.py")})
    costs = {**COSTS, "e2e/d.py": 50.5}
    assert costliest_first(["e2e/d.py", "unit/c.py", "e2e/a.py", "e2e/b.py"], costs) == [
        "e2e/a.py", "unit/c.py", "e2e/b.py", "e2e/d.py"]
    assert lanes.scope_of("e2e/b.py") == lanes.scope_of("unit/c.py") == "g"
    assert lanes.scope_of("e2e/d.py") == "e2e/d.py"


def test_waiting_scopes_are_those_whose_cpu_is_at_most_the_share_of_their_seconds(monkeypatch):
    monkeypatch.setattr(lanes, "GROUPS", {"g": ("e2e/g1.py", "e2e/g2.py")})
    seconds = {"e2e/wait.py": 100.0, "e2e/busy.py": 100.0, "e2e/edge.py": 100.0,
               "e2e/short.py": WAITING_MIN_S / 2, "e2e/g1.py": 100.0, "e2e/g2.py": 100.0,
               "e2e/no_cores.py": 100.0}
    cores = {"e2e/wait.py": 30.0, "e2e/busy.py": 90.0, "e2e/edge.py": WAITING_SHARE * 100.0,
             "e2e/short.py": 0.0, "e2e/g1.py": 10.0, "e2e/g2.py": 190.0,
             "e2e/no_seconds.py": 1.0}
    # the group is judged as one scope: 200 core-s in 200 s, not waiting although g1 alone is;
    # a file short of WAITING_MIN_S, or missing from a table, is not judged
    assert waiting_scopes(seconds, cores) == {"e2e/wait.py", "e2e/edge.py"}
    assert waiting_scopes(seconds, {}) == set()
    assert cpu_shares(seconds, cores) == {"e2e/wait.py": 0.3, "e2e/busy.py": 0.9,
                                          "e2e/edge.py": WAITING_SHARE, "g": 1.0}


SHARES = {"wait1": 0.3, "wait2": WAITING_SHARE, "mid1": 0.65, "mid2": 0.6,
          "busy1": 0.9, "busy2": WAIT_LANE_MAX_SHARE + 0.01}


@pytest.mark.parametrize(("queue", "wait_lane", "with_wait_lanes", "expected"), [
    (["busy1", "wait1", "busy2"], False, False, "busy1"),  # no wait lanes: xdist's order
    (["wait1", "busy1"], False, False, "wait1"),
    (["wait1", "busy1", "wait2"], False, True, "busy1"),  # others leave waiting scopes first
    (["wait1", "new", "busy1"], False, True, "new"),  # an unjudged scope is not waiting
    (["wait1", "wait2"], False, True, "wait1"),  # ... until only those are left
    (["busy1", "wait2", "mid2", "wait1"], True, True, "wait2"),  # a wait lane: the first waiting
    (["busy1", "mid1", "new", "mid2"], True, True, "mid2"),  # ... then the lowest share
    (["busy1", "busy2", "new"], True, True, None),  # ... up to WAIT_LANE_MAX_SHARE: the lane ends
    ([], False, True, None),
    ([], True, True, None),
])
def test_next_scope(queue, wait_lane, with_wait_lanes, expected):
    assert next_scope(queue, SHARES, wait_lane, with_wait_lanes) == expected


def test_the_shipped_groups_name_files_that_exist():
    for files in lanes.GROUPS.values():
        assert all((ROOT / f).is_file() for f in files), files


def test_the_shipped_table_is_read_and_a_missing_one_is_empty(tmp_path):
    costs = file_costs()
    assert costs and all(name.startswith("tests/") and name.endswith(".py") for name in costs)
    assert all(s >= 0 for s in costs.values())
    assert file_costs(tmp_path / "none.json") == {}
    cores = file_costs(column="cores")  # the CPU ledger's, for the wait lanes
    assert cores and all(c >= 0 for c in cores.values())
    assert file_costs(column="no such column") == {}


def test_seconds_per_file_sums_setup_call_and_teardown_per_module(tmp_path):
    """pytest's junit: one testcase per test, `time` its setup + call + teardown; classname is
    the module path, with the class appended for a test in a class."""
    junit = tmp_path / "junit.xml"
    junit.write_text(textwrap.dedent("""\
        <?xml version="1.0" encoding="utf-8"?>
        <testsuites><testsuite name="pytest" tests="4">
        <testcase classname="tests.e2e.test_a" name="test_one" time="10.5"/>
        <testcase classname="tests.e2e.test_a" name="test_two" time="2.0"/>
        <testcase classname="tests.unit.base.test_b.TestGroup" name="test_x" time="0.25"/>
        <testcase classname="tests.unit.base.test_b" name="test_y[1]" time="0.25"/>
        </testsuite></testsuites>"""))
    got = seconds_per_file(junit)
    assert got == {"tests/e2e/test_a.py": 12.5, "tests/unit/base/test_b.py": 0.5}
    assert list(got) == ["tests/e2e/test_a.py", "tests/unit/base/test_b.py"]  # costliest first
    json.dumps(got)


def test_cores_per_file_reads_the_ledgers_report_costliest_first(tmp_path):
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"files": {"tests/a.py": 1.04, "tests/b.py": 20.26},
                                  "tests": {}, "total": 30.0}))
    got = cores_per_file(report)
    assert got == {"tests/b.py": 20.3, "tests/a.py": 1.0} and list(got) == ["tests/b.py", "tests/a.py"]
