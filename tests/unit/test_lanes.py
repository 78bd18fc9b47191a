"""The lane order of `make test` (tests/lanes.py) and the per-file seconds it reads
(benchmarks/suite_durations.py, tests/durations.json)."""

from __future__ import annotations

import json
import textwrap

import pytest

from benchmarks.suite_durations import seconds_per_file
from tests import lanes
from tests.lanes import NEW_FILE_S
from tests.lanes import costliest_first
from tests.lanes import file_costs
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


def test_the_shipped_groups_name_files_that_exist():
    for files in lanes.GROUPS.values():
        assert all((ROOT / f).is_file() for f in files), files


def test_the_shipped_table_is_read_and_a_missing_one_is_empty(tmp_path):
    costs = file_costs()
    assert costs and all(name.startswith("tests/") and name.endswith(".py") for name in costs)
    assert all(s >= 0 for s in costs.values())
    assert file_costs(tmp_path / "none.json") == {}


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
