"""`ray job submit` end to end on one real 2-node Ray cluster started with `ray start` (shared by
the tests of this module):

- issue 4: a job that runs `vllm-sweep run sweep.yaml` with absolute paths, status SUCCEEDED, and
  the trial Parquet under the path the sweep names;
- issue 20: a sweep with relative paths (model, search space, results_dir), as the quickstart
  has, in a directory whose .gitignore lists models/ and results/: `ray job submit --working-dir
  .` fails at once with the one-line reason (the upload leaves models/ out, a relative
  results_dir would vanish with Ray's temp dir); `vllm-sweep submit` runs it in place, prints
  where the results go, and the trial Parquet is read back there.

The pytest process never joins the cluster: node counts come from a short-lived subprocess with a
timeout, the job is submitted with the `ray job submit` CLI (with a timeout), and its status and
logs are read over plain HTTP from the dashboard's Jobs REST API. Nodes are stopped by process
group, never with the Ray CLI's stop command, which ends every Ray on the machine, not just
this test's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest
import yaml

from tests.helpers import CLI
from tests.helpers import ROOT
from tests.helpers import cli_env
from tests.helpers import free_ports
from tests.helpers import new_marker
from tests.helpers import ray_head_argv
from tests.helpers import stop_group
from tests.helpers import wait_no_marked_processes
from tests.helpers import write_sweep

pytestmark = pytest.mark.server


VENV_BIN = Path(sys.executable).parent


RAY = str(VENV_BIN / "ray")


NAME = "jobsweep"


NUM_PROMPTS = 24


TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


_NODES_SCRIPT = """
import sys, ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
print("ALIVE", sum(1 for n in ray.nodes() if n["Alive"]), flush=True)
"""


def node_env(marker: str, tmp: Path) -> dict[str, str]:
    """Environment of the `ray start` processes (and so of every Ray process and job they run).

    The job driver inherits the raylet's environment and Ray does not add the venv's bin dir to
    PATH, so the nodes get the venv's bin dir first on PATH, as an activated virtualenv would on a
    real cluster: then the entrypoint is exactly the README's `vllm-sweep run ...`.
    VLLM_TARGET_DEVICE must stay unset (it would make vLLM skip the project's platform plugin).
    """
    env = cli_env(marker, tmp)
    env["RAY_AUTH_MODE"] = "disabled"
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.pop("VLLM_TARGET_DEVICE", None)
    env.pop("RAY_ADDRESS", None)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


def write_job_sweep(job_dir: Path, model: Path, results: Path) -> Path:
    """The e2e sweep (tests/helpers.write_sweep), one trial with the baseline, as job_dir/sweep.yaml."""
    path = write_sweep(job_dir, model, n_trials=1, name=NAME)
    spec = yaml.safe_load(path.read_text())
    spec["workload"].update({"num_prompts": NUM_PROMPTS, "warmup_requests": 4})
    spec["search"]["baseline"] = True
    spec["results_dir"] = str(results)  # absolute: the job's cwd is Ray's unpacked working dir
    path.unlink()
    target = job_dir / "sweep.yaml"
    target.write_text(yaml.safe_dump(spec))
    return target


def wait_for_dashboard(url: str, head: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        assert head.poll() is None, f"head `ray start` exited with {head.returncode}"
        try:
            with urllib.request.urlopen(f"{url}/api/version", timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError as exc:
            last = str(exc)
        time.sleep(2)
    pytest.fail(f"dashboard at {url} not up within {timeout_s:.0f} s: {last}")


def wait_for_nodes(gcs: str, n: int, env: dict[str, str], nodes: list[subprocess.Popen],
                   timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        for node in nodes:
            assert node.poll() is None, f"`ray start` {node.args} exited with {node.returncode}"
        try:
            out = subprocess.run([sys.executable, "-c", _NODES_SCRIPT, gcs], env=env,
                                 capture_output=True, text=True, timeout=60)
            last = out.stdout + out.stderr[-1500:]
            match = re.search(r"ALIVE (\d+)", out.stdout)
            if match and int(match.group(1)) >= n:
                return
        except subprocess.TimeoutExpired:
            last = "ray.init timed out"
        time.sleep(2)
    pytest.fail(f"{n} alive nodes not seen within {timeout_s:.0f} s: {last}")


def ray_job(args: list[str], env: dict[str, str],
            timeout_s: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([RAY, "job", *args], env=env, capture_output=True, text=True,
                          timeout=timeout_s)


def submit_job(dashboard: str, job_dir: Path, job_id: str, env: dict[str, str],
               timeout_s: float, sweep: str = "sweep.yaml") -> subprocess.CompletedProcess:
    """`ray job submit --no-wait`, retried while the dashboard answers but the head's dashboard
    agent has not registered yet (HTTP 500 "No available agent to submit job"), which happens for
    a few seconds after the dashboard's /api/version is up."""
    argv = ["submit", "--address", dashboard, "--working-dir", str(job_dir),
            "--submission-id", job_id, "--no-wait", "--", "vllm-sweep", "run", sweep]
    deadline = time.monotonic() + timeout_s
    while True:
        out = ray_job(argv, env, timeout_s=120)
        if (out.returncode == 0 or "No available agent" not in out.stdout + out.stderr
                or time.monotonic() > deadline):
            return out
        time.sleep(3)


def retry_while_no_agent(argv: list[str], cwd: Path, env: dict[str, str], timeout_s: float,
                         agent_wait_s: float = 240) -> subprocess.CompletedProcess:
    """`argv` run to its end, again while the head's dashboard agent is not registered yet
    (see submit_job)."""
    deadline = time.monotonic() + agent_wait_s
    while True:
        out = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                             timeout=timeout_s)
        if (out.returncode == 0 or "No available agent" not in out.stdout + out.stderr
                or time.monotonic() > deadline):
            return out
        time.sleep(3)


def wait_terminal(dashboard: str, job_id: str, timeout_s: float) -> str:
    status, deadline = "UNKNOWN", time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = job_status(dashboard, job_id)
        if status in TERMINAL:
            break
        time.sleep(5)
    return status


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.load(resp)


def job_status(dashboard: str, job_id: str) -> str:
    """The job's status from the Jobs REST API (GET /api/jobs/<id>), plain HTTP: `ray job status`
    prints a banner ("Job '...' succeeded") rather than the status for terminal states."""
    try:
        return str(_get_json(f"{dashboard}/api/jobs/{job_id}")["status"])
    except (OSError, ValueError, KeyError) as exc:
        return f"UNKNOWN ({exc})"


def job_logs(dashboard: str, job_id: str) -> str:
    try:
        return str(_get_json(f"{dashboard}/api/jobs/{job_id}/logs")["logs"])
    except (OSError, ValueError, KeyError) as exc:
        return f"(job logs unavailable: {exc})"


@dataclass(frozen=True)
class JobCluster:
    dashboard: str
    env: dict[str, str]
    marker: str
    tmp: Path


@pytest.fixture(scope="module")
def job_cluster():
    """A head (2 CPUs, dashboard) and a worker (1 CPU) on loopback, started with `ray start
    --block` in their own process groups and stopped by process group."""
    tmp = Path(tempfile.mkdtemp(prefix="vsj-"))  # short: Ray's unix socket paths
    marker = new_marker()
    env = node_env(marker, tmp)
    gcs_port, dash_port, agent_port, client_port, worker_agent_port = free_ports(5)
    gcs = f"127.0.0.11:{gcs_port}"  # not 127.0.0.1: `ray start` swaps it for the machine's address
    dashboard = f"http://127.0.0.1:{dash_port}"
    (tmp / "h").mkdir()
    (tmp / "w").mkdir()
    head_argv = ray_head_argv(RAY, "127.0.0.11", [gcs_port, dash_port, agent_port, client_port],
                              tmp / "h", 2)
    worker_argv = [RAY, "start", "--block", "--address", gcs,
                   "--node-ip-address", "127.0.0.2", "--temp-dir", str(tmp / "w"),
                   "--num-cpus", "1", "--dashboard-agent-listen-port", str(worker_agent_port)]
    nodes: list[subprocess.Popen] = []
    node_logs = [(tmp / "head.out").open("w"), (tmp / "worker.out").open("w")]
    t0 = time.monotonic()
    try:
        nodes.append(subprocess.Popen(head_argv, env=env, stdout=node_logs[0],
                                      stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True))
        wait_for_nodes(gcs, 1, env, nodes, timeout_s=180)
        nodes.append(subprocess.Popen(worker_argv, env=env, stdout=node_logs[1],
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True))
        wait_for_nodes(gcs, 2, env, nodes, timeout_s=180)
        wait_for_dashboard(dashboard, nodes[0], timeout_s=120)
        print(f"\ncluster up in {time.monotonic() - t0:.0f} s")
        yield JobCluster(dashboard, env, marker, tmp)
    finally:
        for node in reversed(nodes):  # worker first, then the head
            stop_group(node)
        for log in node_logs:
            log.close()
        left = wait_no_marked_processes(marker)
        print(f"teardown done at {time.monotonic() - t0:.0f} s; processes left: {left}")
        shutil.rmtree(tmp, ignore_errors=True)
    assert left == []


def assert_one_complete_trial(results: Path, logs: str) -> None:
    trials = duckdb.sql(
        f"SELECT * FROM read_parquet('{results}/{NAME}/trials/**/*.parquet', "
        "hive_partitioning=true)").df()
    assert len(trials) == 1, trials
    row = trials.iloc[0]
    assert row["state"] == "COMPLETE", (row.get("fail_reason"), row.get("fail_detail"),
                                        logs[-4000:])
    assert row["completed"] == NUM_PROMPTS and row["failed"] == 0
    assert row["sweep"] == NAME
    assert (results / NAME / "optuna.journal").is_file()


@pytest.mark.timeout(900)
def test_ray_job_submit_runs_a_sweep_on_a_two_node_cluster(tiny_model, job_cluster):
    c = job_cluster
    job_dir = c.tmp / "job"
    job_dir.mkdir()
    results = c.tmp / "results"
    write_job_sweep(job_dir, tiny_model, results)
    job_id = f"vsweep-{c.marker[:8]}"
    t0 = time.monotonic()
    # The working dir holds just sweep.yaml: a small upload, no .venv, no models/.
    submit = submit_job(c.dashboard, job_dir, job_id, c.env, timeout_s=240)
    assert submit.returncode == 0, submit.stdout[-3000:] + submit.stderr[-3000:]
    status = wait_terminal(c.dashboard, job_id, timeout_s=660)
    logs = job_logs(c.dashboard, job_id)
    print(f"job {job_id}: {status} after {time.monotonic() - t0:.0f} s")
    assert status == "SUCCEEDED", f"job status {status}; logs:\n{logs[-6000:]}"
    assert "Ray: joined existing cluster" in logs, logs[-6000:]
    assert f"results: {results / NAME}" in logs, logs[-3000:]
    assert_one_complete_trial(results, logs)


def write_relative_repo(repo: Path, model: Path) -> str:
    """A checkout-like folder: sweeps/rel.yaml naming models/tiny-llama, search_spaces/ and
    results relatively (as the quickstart does), a .gitignore listing /models and /results/ as
    the project's does, and models/tiny-llama as a link to the built model."""
    (repo / "sweeps").mkdir(parents=True)
    (repo / "search_spaces").mkdir()
    (repo / "models").mkdir()
    (repo / "models" / "tiny-llama").symlink_to(model)
    shutil.copy(ROOT / "search_spaces" / "tiny_cpu.yaml", repo / "search_spaces")
    (repo / ".gitignore").write_text("/models\n/results/\n")
    spec = yaml.safe_load(write_job_sweep(repo, model, repo / "unused").read_text())
    (repo / "sweep.yaml").unlink()
    spec.update({"model": "models/tiny-llama", "search_space": "search_spaces/tiny_cpu.yaml",
                 "results_dir": "results"})
    (repo / "sweeps" / "rel.yaml").write_text(yaml.safe_dump(spec))
    return "sweeps/rel.yaml"


@pytest.mark.timeout(900)
def test_relative_sweep_submitted_in_place_and_refused_when_uploaded(tiny_model, job_cluster):
    c = job_cluster
    repo = c.tmp / "repo"
    sweep = write_relative_repo(repo, tiny_model)
    t0 = time.monotonic()

    # The command: Ray uploads repo/ without models/ and runs the job in the copy.
    uploaded_id = f"vsweep-up-{c.marker[:8]}"
    out = submit_job(c.dashboard, repo, uploaded_id, c.env, timeout_s=240, sweep=sweep)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    status = wait_terminal(c.dashboard, uploaded_id, timeout_s=180)
    logs = job_logs(c.dashboard, uploaded_id)
    assert status == "FAILED", logs[-3000:]
    assert "results_dir: 'results': relative, and this Ray job runs in Ray's temporary copy" \
        in logs and "vllm-sweep submit" in logs, logs[-3000:]
    assert not (repo / "results").exists()

    # vllm-sweep submit: the job runs in repo/ itself (local://), on both nodes.
    job_id = f"vsweep-rel-{c.marker[:8]}"
    out = retry_while_no_agent([*CLI, "submit", sweep, "--address", c.dashboard,
                                "--submission-id", job_id], repo, c.env, timeout_s=660)
    print(f"vllm-sweep submit: exit {out.returncode} after {time.monotonic() - t0:.0f} s")
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    printed = re.findall(r"results: (\S+)$", out.stdout, re.MULTILINE)
    place = repo / "results" / NAME
    # at submission, at the end of the job's own log, and once the job has finished
    assert printed == [str(place)] * 3, out.stdout[-3000:]
    assert f"job {job_id}: SUCCEEDED (exit code 0)" in out.stdout
    assert job_status(c.dashboard, job_id) == "SUCCEEDED"
    assert_one_complete_trial(Path(printed[-1]).parent, out.stdout)
