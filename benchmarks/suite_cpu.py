"""Where the test suite's CPU goes, per test file and per test: core-seconds, not lane seconds.

Junit seconds say how long a test held its lane, not what it cost the machine: with two lanes on
two cores, a test that waits on a server its sibling lane's test is starving looks costly. This
ledger charges each process's CPU to the test its lane was running when it was spent.

    python -m benchmarks.suite_cpu sample DIR &      # every SAMPLE_S: each process's CPU ticks
    VSWEEP_CPU_LEDGER=DIR PYTEST_ADDOPTS="-p benchmarks.suite_cpu" make test
    python -m benchmarks.suite_cpu report DIR        # core-s per file, per test, per kind

The plugin (loaded with `-p benchmarks.suite_cpu`, active only when VSWEEP_CPU_LEDGER is set)
writes, in every lane (xdist worker), each test's start and end with the lane's pid. The
sampler reads /proc every SAMPLE_S: (pid, start time) -> parent at first sight, and each
interval's CPU delta. A process's lane is the lane pid among its ancestors (as first seen); its
delta in an interval goes to the test that lane was running at the interval's end. Processes
that left their lane's tree before first seen (daemonised, e.g. `ray start`'s) and the machine's
other processes are reported as unattributed, by kind. A process that lives less than SAMPLE_S
is missed (its CPU is small by construction).
"""

from __future__ import annotations

import bisect
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

SAMPLE_S = 1.0
HZ = os.sysconf("SC_CLK_TCK")
LEDGER_VAR = "VSWEEP_CPU_LEDGER"

KINDS = [  # (kind, substring of the command line or name), first match wins
    ("EngineCore", "EngineCore"), ("vllm worker", "VLLM::Worker"), ("vllm worker", "RayWorkerWrapper"),
    ("zygote", "framework.engine.zygote"), ("ServerActor", "ServerActor"),
    ("FakeEngine", "fake_engine"), ("raylet", "raylet"), ("gcs", "gcs_server"),
    ("ray agent", "DashboardAgent"), ("ray agent", "RuntimeEnvAgent"), ("dashboard", "dashboard"),
    ("ray worker", "ray::"), ("ray worker", "default_worker"),
    ("vllm-sweep cli", "framework.cli"), ("vllm-sweep cli", "bin/vllm-sweep"),
    ("pytest lane", "xdist"), ("pytest lane", "pytest"), ("chromium", "chrom"),
]


def kind_of(cmdline: str) -> str:
    for kind, part in KINDS:
        if part in cmdline:
            return kind
    return "other: " + (cmdline.split(" ")[0].rsplit("/", 1)[-1][:30] or "?")


def _scan() -> dict[tuple[int, int], tuple[int, int, str]]:
    """{(pid, start ticks): (ppid, cpu ticks, name)} of every process now."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[(int(entry), int(fields[19]))] = (int(fields[1]), int(fields[11]) + int(fields[12]), name)
    return out


def _cmdline(pid: int, name: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            text = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        text = ""
    return (text or name)[:240]


def sample(folder: Path) -> None:
    """Append a line per SAMPLE_S to folder/samples.jsonl: {"t", "new": {key: [ppid, cmdline,
    ticks before]}, "d": {key: ticks}}, key "pid:start"; runs until killed."""
    folder.mkdir(parents=True, exist_ok=True)
    seen: dict[tuple[int, int], int] = dict.fromkeys(_scan(), -1)  # before: not charged
    with open(folder / "samples.jsonl", "a", encoding="utf-8") as out:
        while True:
            time.sleep(SAMPLE_S)
            new, delta = {}, {}
            for key, (ppid, ticks, name) in _scan().items():
                before = seen.get(key)
                if before is None:
                    new[f"{key[0]}:{key[1]}"] = [ppid, _cmdline(key[0], name)]
                    before = 0
                if before >= 0 and ticks > before:
                    delta[f"{key[0]}:{key[1]}"] = ticks - before
                seen[key] = ticks if before >= 0 else -1
            out.write(json.dumps({"t": time.time(), "new": new, "d": delta}) + "\n")
            out.flush()


# ---- the pytest plugin: each lane's tests with their start and end ------------------------

def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    _event("start", nodeid)


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    _event("end", nodeid)


def _event(what: str, nodeid: str) -> None:
    folder = os.environ.get(LEDGER_VAR)
    if not folder:
        return
    with open(Path(folder) / f"lane-{os.getpid()}.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"t": time.time(), "what": what, "test": nodeid, "pid": os.getpid()}) + "\n")


# ---- the report ---------------------------------------------------------------------------

def report(folder: Path) -> dict:
    """{"tests": {nodeid: core-s}, "files": {file: core-s}, "kinds": {file: {kind: core-s}},
    "unattributed": {kind: core-s}, "total": core-s}."""
    lanes: dict[int, list[tuple[float, str | None]]] = {}
    for path in folder.glob("lane-*.jsonl"):
        events = [json.loads(line) for line in path.read_text().splitlines()]
        timeline = [(e["t"], e["test"] if e["what"] == "start" else None) for e in events]
        lanes[events[0]["pid"]] = sorted(timeline, key=lambda x: x[0])
    parent: dict[str, str] = {}
    cmd: dict[str, str] = {}
    live_by_pid: dict[int, str] = {}  # pid -> newest key: a parent is named by pid only
    lane_of: dict[str, int | None] = {}
    tests: dict[str, float] = defaultdict(float)
    kinds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    loose: dict[str, float] = defaultdict(float)
    total = 0.0
    for line in (folder / "samples.jsonl").read_text().splitlines():
        s = json.loads(line)
        for key, (ppid, cmdline) in s["new"].items():
            pid = int(key.split(":")[0])
            parent[key] = live_by_pid.get(ppid, "")
            cmd[key] = cmdline
            live_by_pid[pid] = key
            lane_of[key] = pid if pid in lanes else lane_of.get(parent[key])
        for key, ticks in s["d"].items():
            seconds = ticks / HZ
            total += seconds
            lane = lane_of.get(key)
            kind = "pytest lane" if int(key.split(":")[0]) in lanes else kind_of(cmd.get(key, ""))
            test = _test_at(lanes[lane], s["t"]) if lane is not None else None
            if test is None:
                loose[kind] += seconds
                continue
            tests[test] += seconds
            kinds[test.split("::")[0]][kind] += seconds
    files: dict[str, float] = defaultdict(float)
    for test, seconds in tests.items():
        files[test.split("::")[0]] += seconds
    return {"tests": dict(tests), "files": dict(files), "kinds": {f: dict(k) for f, k in kinds.items()},
            "unattributed": dict(loose), "total": total}


def _test_at(timeline: list[tuple[float, str | None]], t: float) -> str | None:
    """The test a lane was running at `t` (None between tests)."""
    i = bisect.bisect_right([x[0] for x in timeline], t) - 1
    return timeline[i][1] if i >= 0 else None


def _print(result: dict, top: int = 40) -> None:
    print(f"total core-s {result['total']:.0f}; attributed to tests {sum(result['files'].values()):.0f}")
    print("\ncore-s  file  (largest kinds)")
    for f, s in sorted(result["files"].items(), key=lambda x: -x[1])[:top]:
        k = sorted(result["kinds"][f].items(), key=lambda x: -x[1])[:4]
        print(f"{s:7.1f}  {f}  " + ", ".join(f"{n} {v:.0f}" for n, v in k))
    print("\ncore-s  test")
    for t, s in sorted(result["tests"].items(), key=lambda x: -x[1])[:top]:
        print(f"{s:7.1f}  {t}")
    print("\nunattributed (not under a lane, or between tests):")
    for k, s in sorted(result["unattributed"].items(), key=lambda x: -x[1])[:12]:
        print(f"{s:7.1f}  {k}")


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("sample", "report"):
        print("usage: python -m benchmarks.suite_cpu sample|report DIR", file=sys.stderr)
        return 2
    folder = Path(argv[1])
    if argv[0] == "sample":
        sample(folder)
        return 0
    result = report(folder)
    (folder / "report.json").write_text(json.dumps(result, indent=1))
    _print(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
