"""Real vLLM servers that fail, and a driver killed with kill -9:
- a server killed in the middle of the load: FAIL(server_died) with the log tail, the request
  rows measured so far kept, the sweep's other trials unaffected (one sweep with the last
  item);
- out of KV cache memory at start-up: FAIL(oom_at_startup) (on the session's shared Ray);
- kill -9 of the driver mid-sweep, then the same `run` again: the study continues, the
  interrupted trial is recorded once as FAIL(interrupted), no row is duplicated or lost, no
  partial Parquet file is visible, and no process of either run remains;
- the node's warm zygote killed mid-sweep: the next trial starts another."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import duckdb
import pandas as pd
import psutil
import pytest
import yaml

from framework.base.exit_codes import EXIT_NO_FEASIBLE
from framework.engine.zygote import FOLDER_PREFIX
from framework.load.http_client import get_sync
from tests.helpers import cli_env
from tests.helpers import cli_process
from tests.helpers import engine_cores
from tests.helpers import join_shared
from tests.helpers import marked_processes
from tests.helpers import new_engine_core
from tests.helpers import new_marker
from tests.helpers import read_trials
from tests.helpers import read_until
from tests.helpers import run_cli
from tests.helpers import run_joined
from tests.helpers import start_driver
from tests.helpers import wait_no_marked_processes
from tests.helpers import write_sweep

pytestmark = pytest.mark.server


@pytest.mark.timeout(900)
def test_engine_and_zygote_killed_mid_load_then_the_next_trial_starts_another(tiny_model,
                                                                             short_tmp):
    """Trial 0 under load: its EngineCore is killed once the server answered some requests,
    then the node's warm zygote (as by the OOM killer). Trial 0 is FAIL(server_died) with its
    log tail and the rows measured so far; trial 1 finds the zygote dead, starts another,
    completes, still warm_start, and the new zygote ends with the sweep."""
    marker = new_marker()
    env = cli_env(marker, short_tmp)
    sweep = write_sweep(short_tmp, tiny_model, n_trials=2, name="faults")
    spec = yaml.safe_load(sweep.read_text())
    spec["workload"].update({"num_prompts": 400, "output_len": 32, "request_rate": 25.0})
    sweep.write_text(yaml.safe_dump(spec))
    with cli_process(["run", str(sweep)], short_tmp, env) as proc:
        seen = read_until(proc, "trial 0: under load", timeout_s=400)
        assert "trial 0: under load" in seen, seen
        engines = [p for p in marked_processes(marker) if "EngineCore" in " ".join(p.cmdline())]
        assert engines, "no vLLM EngineCore process found"
        old = _zygotes(proc.pid)
        assert len(old) == 1, old
        folders = [_folder(old[0])]
        # killed once the server has answered 20 measured requests (of 400, at 25/s): some
        # rows succeed, most are cut
        url = vllm_metrics_url(psutil.Process(proc.pid))
        assert url is not None, "no vLLM server found below the driver"
        assert served(url, 8 + 20, timeout_s=120), "the server answered too few requests"
        for p in engines:
            p.kill()
        old[0].kill()
        old[0].wait(timeout=30)
        seen += read_until(proc, "trial 1: under load", timeout_s=400)
        new = _zygotes(proc.pid)
        assert len(new) == 1 and new[0].pid != old[0].pid, (new, seen[-3000:])
        folders.append(_folder(new[0]))
        out, _ = proc.communicate(timeout=600)
        seen += out
    assert proc.returncode == 0, seen[-3000:]
    assert "the zygote had died; starting another" in seen, seen[-3000:]
    trials = read_trials(short_tmp / "results", "faults")
    assert list(trials["trial_number"]) == [0, 1]
    dead, second = trials.iloc[0], trials.iloc[1]
    assert dead["state"] == "FAIL" and dead["fail_reason"] == "server_died", dead["fail_detail"]
    assert dead["log_tail"] and len(dead["log_tail"].splitlines()) <= 50
    assert second["state"] == "COMPLETE", second["fail_detail"]
    assert list(second["startup_levers"]) == ["warm_start"]
    n, ok = duckdb.sql(
        f"SELECT count(*), count(*) FILTER (WHERE success) FROM read_parquet("
        f"'{short_tmp}/results/faults/requests/**/*.parquet', hive_partitioning=true) "
        "WHERE trial_number = 0").fetchall()[0]
    assert n > 0 and 0 < ok < 400, (n, ok)
    new[0].wait(timeout=30)  # it died with its keeper (psutil.TimeoutExpired if not)
    assert all(f.name.startswith(FOLDER_PREFIX) and not f.exists() for f in folders), folders
    assert wait_no_marked_processes(marker) == []


@pytest.mark.timeout(600)
def test_kv_cache_too_small_at_startup_is_oom_at_startup(shared_ray, tiny_model, short_tmp):
    """Two KV blocks cannot hold one 512-token sequence: vLLM's memory check stops the engine
    before ready; the trial is FAIL(oom_at_startup) naming vLLM's own numbers."""
    sweep = write_sweep(short_tmp, tiny_model, n_trials=1, name="oom")
    spec = yaml.safe_load(sweep.read_text())
    spec["server"]["args"]["num-gpu-blocks-override"] = 2
    sweep.write_text(yaml.safe_dump(join_shared(spec, shared_ray)))
    res = run_joined(shared_ray, ["run", str(sweep)], short_tmp)
    # its only trial failed: the sweep ended with no configuration meeting the SLA
    assert res.returncode == EXIT_NO_FEASIBLE, res.stdout[-3000:] + res.stderr[-3000:]
    trials = read_trials(short_tmp / "results", "oom")
    row = trials.iloc[0]
    assert row["fail_reason"] == "oom_at_startup", (row["fail_reason"], row["fail_detail"])
    assert "KV cache" in row["fail_detail"] and "512" in row["fail_detail"], row["fail_detail"]
    assert row["startup_s"] is None or pd.isna(row["startup_s"])


@pytest.mark.timeout(900)
def test_kill_9_of_the_driver_then_resume(tiny_model, short_tmp):
    marker = new_marker()
    env = cli_env(marker, short_tmp)
    sweep = write_sweep(short_tmp, tiny_model, n_trials=3, name="resume")
    proc = start_driver(sweep, short_tmp, env)
    try:
        seen = read_until(proc, "trial 1: starting server", timeout_s=400)
        assert "trial 1: starting server" in seen, seen
        # kill while trial 1's vLLM is starting: its EngineCore exists, the server is not ready
        # (a warm start is ~5 s, so a fixed sleep can outlast the whole trial)
        assert new_engine_core(marker, engine_cores(marker), timeout_s=120), seen
        os.kill(proc.pid, signal.SIGKILL)  # the driver alone: its Ray and vLLM are orphaned
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    after_kill = read_trials(short_tmp / "results", "resume")
    assert list(after_kill["trial_number"]) == [0]

    again = run_cli(["run", str(sweep)], short_tmp, env, timeout_s=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "trial 1 was interrupted by an earlier run" in again.stdout
    trials = read_trials(short_tmp / "results", "resume")
    assert list(trials["trial_number"]) == [0, 1, 2]
    assert list(trials["state"]) == ["COMPLETE", "FAIL", "COMPLETE"]
    assert trials.iloc[1]["fail_reason"] == "interrupted"
    requests = duckdb.sql(
        f"SELECT trial_number, count(*) FROM read_parquet('{short_tmp}/results/resume/requests/"
        "**/*.parquet', hive_partitioning=true) GROUP BY ALL ORDER BY 1").fetchall()
    assert requests == [(0, 40), (2, 40)]
    visible = sorted(p.name for p in (short_tmp / "results" / "resume").rglob("*.parquet"))
    assert all(name.startswith("trial-") for name in visible), visible
    assert not (short_tmp / "results" / "resume" / "driver.json").exists()
    assert wait_no_marked_processes(marker, timeout_s=30) == []


def vllm_metrics_url(root: psutil.Process) -> str | None:
    """The /metrics URL of the vLLM API server among `root`'s descendants (with warm_start it is
    a fork of the zygote, not EngineCore's parent): the loopback port whose /metrics page has
    vLLM's request counter (Ray's own processes listen too)."""
    ports = set()
    for p in root.children(recursive=True):
        try:
            ports |= {c.laddr.port for c in p.net_connections(kind="tcp")
                      if c.status == psutil.CONN_LISTEN and c.laddr.ip.startswith("127.")}
        except psutil.Error:
            continue
    for port in sorted(ports):
        url = f"http://127.0.0.1:{port}/metrics"
        try:
            if SUCCESS in get_sync(url, 5.0).text():
                return url
        except (OSError, ValueError):
            continue
    return None


SUCCESS = "vllm:request_success_total"


def served(url: str, n: int, timeout_s: float) -> bool:
    """Wait until the server at the /metrics `url` has completed n requests (vLLM's
    request_success_total, summed over its labels); whether it got there in time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            text = get_sync(url, 10.0).text()
        except OSError:
            return False  # the server is gone
        done = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(SUCCESS))
        if done >= n:
            return True
        time.sleep(0.2)
    return False


def _zygotes(driver_pid: int) -> list[psutil.Process]:
    """The driver's zygotes (its Ray's keeper actors' children), not their forks, which keep
    the zygote's command line. Found by descent: setproctitle, which the zygote calls, hides
    its environment (and so the test marker) from /proc."""
    found = []
    for p in psutil.Process(driver_pid).children(recursive=True):
        try:
            if "framework.engine.zygote" in " ".join(p.cmdline()) and \
                    "framework.engine.zygote" not in " ".join(p.parent().cmdline()):
                found.append(p)
        except psutil.Error:
            continue
    return found

def _folder(zygote: psutil.Process) -> Path:
    """The zygote's folder: its socket's (`python -m framework.engine.zygote SOCKET`)."""
    args = " ".join(zygote.cmdline()).split()
    return Path(args[args.index("framework.engine.zygote") + 1]).parent
