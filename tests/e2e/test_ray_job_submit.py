"""`ray job submit` end to end on one real 2-node Ray cluster started with `ray start` (shared by
the tests of this module), its sweeps on FakeEngine: these tests are about the job (its driver,
working dir, results place, status and log), not about vLLM, whose servers every other vLLM
sweep starts.

- issue 4: a job that runs `vllm-sweep run sweep.yaml` with absolute paths, status SUCCEEDED, and
  the trial Parquet under the path the sweep names;
- issue 20: a sweep with relative paths (model, search space, results_dir), as the quickstart
  has, in a directory whose .gitignore lists models/ and results/: `ray job submit --working-dir
  .` fails at once with the one-line reason (the upload leaves models/ out, a relative
  results_dir would vanish with Ray's temp dir); `vllm-sweep submit` runs it in place, prints
  where the results go, and the trial Parquet is read back there;
- issue 35 item 3: the same upload with the results in an S3 bucket is not refused, and the
  rows reach the bucket.

The smallest cluster that shows these bugs: a head (2 CPUs, no GPU) where Ray runs the job's
driver, and a worker (1 CPU, 1 fake GPU) where the trial's server must then run, so every trial
runs on another node than its driver (a path, address or folder resolved on the driver's node
only, as the uploaded copy of issue 20 was, fails there; the trial row's node_ip says where it
ran).

The worker is an isolated node (#32: it sees neither the head's files nor its processes, as
another host would not). The pytest process never joins the cluster: the head is up when its
`ray start` says so (tests/ray_start.py), the worker when the GCS lists it, the job is
submitted with the `ray job submit` CLI (with a timeout) or `vllm-sweep submit` (in-process:
Ray's job API over HTTP), and its status and logs are read over plain HTTP from the
dashboard's Jobs REST API. Nodes are stopped by process group, never with the
Ray CLI's stop command, which ends every Ray on the machine, not just this test's.
"""

from __future__ import annotations

import contextlib
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
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pytest
import yaml

from tests.cli import cli_env
from tests.cli import cli_in_process
from tests.clusters import free_ports
from tests.clusters import ray_head_argv
from tests.isolated_nodes import isolated_node
from tests.paths import ROOT
from tests.procs import new_marker
from tests.procs import wait_no_marked_processes
from tests.ray_start import start_up
from tests.ray_start import stop_nodes
from tests.storage_servers import BUCKET
from tests.storage_servers import s3_server
from tests.sweeps import NO_REMEASURE

pytestmark = pytest.mark.server


VENV_BIN = Path(sys.executable).parent
RAY = str(VENV_BIN / "ray")
NAME = "jobsweep"
NUM_PROMPTS = 24
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
HEAD_IP, WORKER_IP = "127.0.0.11", "127.0.0.2"  # not 127.0.0.1: `ray start` swaps it


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


def job_spec(model: str, search_space: str, results: str) -> dict:
    """One FakeEngine trial (vLLM's defaults, the baseline) of NUM_PROMPTS measured requests,
    its server on the node Ray places it on (the worker: the only GPU); its run is never cut
    (stop_early off: a stall of a loaded machine cannot end it short of its requests)."""
    return {
        "name": NAME, "model": model, "search_space": search_space, "engine": "fake",
        "server": {"host": "node", "startup_timeout_s": 120,
                   "env": {"FAKE_ENGINE_STARTUP_S": "0", "FAKE_ENGINE_TTFT_MS": "20",
                           "FAKE_ENGINE_TPOT_MS": "5"}},
        "workload": {"num_prompts": NUM_PROMPTS, "input_len": 32, "output_len": 8,
                     "max_concurrency": 8, "warmup_requests": 4, "seed": 1},
        "sla": {"p99_ttft_ms": 5000},
        "search": {**NO_REMEASURE, "n_trials": 1, "seed": 3, "baseline": True,
                   "stop_early": False},
        "results_dir": results,
    }


def write_job_sweep(job_dir: Path, model: Path, results: Path) -> Path:
    """job_spec with absolute paths (the job's cwd is Ray's unpacked working dir), as
    job_dir/sweep.yaml."""
    target = job_dir / "sweep.yaml"
    target.write_text(yaml.safe_dump(job_spec(
        str(model), str(ROOT / "search_spaces" / "tiny_cpu.yaml"), str(results))))
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
        time.sleep(0.5)
    pytest.fail(f"dashboard at {url} not up within {timeout_s:.0f} s: {last}")


def ray_job(args: list[str], env: dict[str, str], timeout_s: float = 90,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([RAY, "job", *args], env=env, capture_output=True, text=True,
                          timeout=timeout_s, cwd=cwd)


NO_AGENT = "No available agent"  # the head's dashboard agent not registered yet


def submit_job(dashboard: str, job_dir: Path, job_id: str, env: dict[str, str],
               timeout_s: float, sweep: str = "sweep.yaml", runtime_env: dict | None = None,
               from_dir: bool = False) -> subprocess.CompletedProcess:
    """`ray job submit --no-wait`, retried while the dashboard answers but the head's dashboard
    agent has not registered yet (HTTP 500 "No available agent to submit job"), which happens for
    a few seconds after the dashboard's /api/version is up. `from_dir`: run in `job_dir` with
    `--working-dir .`, as a user types it; `runtime_env`: given as --runtime-env-json."""
    extra = ["--runtime-env-json", json.dumps(runtime_env)] if runtime_env else []
    argv = ["submit", "--address", dashboard, "--working-dir", "." if from_dir else str(job_dir),
            *extra, "--submission-id", job_id, "--no-wait", "--", "vllm-sweep", "run", sweep]
    deadline = time.monotonic() + timeout_s
    while True:
        out = ray_job(argv, env, timeout_s=120, cwd=job_dir if from_dir else None)
        if (out.returncode == 0 or NO_AGENT not in out.stdout + out.stderr
                or time.monotonic() > deadline):
            return out
        time.sleep(1)


def vllm_sweep_submit(args: list[str], cwd: Path, env: dict[str, str],
                      agent_wait_s: float = 240) -> subprocess.CompletedProcess:
    """`vllm-sweep submit ARGS` in this process (tests.cli.cli_in_process: it talks to the
    dashboard over HTTP and joins no cluster), again while the head's dashboard agent is not
    registered yet (see submit_job)."""
    deadline = time.monotonic() + agent_wait_s
    while True:
        out = cli_in_process("submit", *args, cwd=cwd, env=env)
        if (out.returncode == 0 or NO_AGENT not in out.stdout + out.stderr
                or time.monotonic() > deadline):
            return out
        time.sleep(1)


def wait_terminal(dashboard: str, job_id: str, timeout_s: float) -> str:
    status, deadline = "UNKNOWN", time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = job_status(dashboard, job_id)
        if status in TERMINAL:
            break
        time.sleep(1)
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
    """A head (2 CPUs, dashboard, no GPU) started with `ray start --block` in its own process
    group and stopped by it, and a worker (1 CPU, 1 fake GPU) that is an isolated node
    (tests/isolated_nodes.py, #32: its own mount and PID namespace), both on loopback. The
    nodes' folders (their TMPDIR, HOME and Ray folders) lie in `tmp`/nodes, which the worker
    sees only its own part of, as a host sees its own disk; the jobs' folders, the sweeps'
    checkouts and results lie beside it in `tmp`, which every node sees, as a shared file
    system (the README's /mnt/shared results)."""
    tmp = Path(tempfile.mkdtemp(prefix="vsj-"))  # short: Ray's unix socket paths
    marker = new_marker()
    nodes_dir = tmp / "nodes"
    head_dir = nodes_dir / "h"
    head_dir.mkdir(parents=True)
    env = node_env(marker, tmp)
    head_env = {**env, "TMPDIR": str(head_dir), "HOME": str(head_dir)}
    gcs_port, dash_port, agent_port, client_port = free_ports(4)
    gcs = f"{HEAD_IP}:{gcs_port}"
    dashboard = f"http://127.0.0.1:{dash_port}"
    head_argv = ray_head_argv(RAY, HEAD_IP, [gcs_port, dash_port, agent_port, client_port],
                              head_dir, 2)
    nodes: list[subprocess.Popen] = []
    t0 = time.monotonic()
    try:
        with contextlib.ExitStack() as stack:
            nodes.append(start_up(head_argv, head_env, tmp / "head.out", timeout_s=180))
            stack.enter_context(isolated_node(gcs, nodes_dir, WORKER_IP, marker, num_cpus=1,
                                              num_gpus=1, timeout_s=180, base_env=env))
            wait_for_dashboard(dashboard, nodes[0], timeout_s=120)
            print(f"\ncluster up in {time.monotonic() - t0:.0f} s")
            yield JobCluster(dashboard, env, marker, tmp)
    finally:
        stop_nodes(nodes)
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
    assert row["node_ip"] == WORKER_IP  # not the driver's node
    assert (results / NAME / "optuna.journal").is_file()


@pytest.mark.timeout(600)
def test_ray_job_submit_runs_a_sweep_on_a_two_node_cluster(tiny_model, job_cluster):
    """Guards issue 4: `ray job submit -- vllm-sweep run` on an existing cluster joins it (no
    private Ray in the job) and writes the Parquet where the sweep says."""
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
    status = wait_terminal(c.dashboard, job_id, timeout_s=480)
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
    spec = job_spec("models/tiny-llama", "search_spaces/tiny_cpu.yaml", "results")
    (repo / "sweeps" / "rel.yaml").write_text(yaml.safe_dump(spec))
    return "sweeps/rel.yaml"


@pytest.mark.timeout(600)
def test_relative_sweep_submitted_in_place_and_refused_when_uploaded(tiny_model, job_cluster):
    """Guards issue 20: a relative results_dir in Ray's uploaded copy would vanish with Ray's
    temp dir (refused, one line); `vllm-sweep submit` runs the same sweep in place, the trial on
    the worker node finding the relative model, and prints the durable place."""
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

    # vllm-sweep submit: the job runs in repo/ itself (local://), its trial on the worker.
    job_id = f"vsweep-rel-{c.marker[:8]}"
    out = vllm_sweep_submit([sweep, "--address", c.dashboard, "--submission-id", job_id],
                            repo, c.env)
    print(f"vllm-sweep submit: exit {out.returncode} after {time.monotonic() - t0:.0f} s")
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    printed = re.findall(r"results: (\S+)$", out.stdout, re.MULTILINE)
    place = repo / "results" / NAME
    # at submission, at the end of the job's own log, and once the job has finished
    assert printed == [str(place)] * 3, out.stdout[-3000:]
    assert f"job {job_id}: SUCCEEDED (exit code 0)" in out.stdout
    assert job_status(c.dashboard, job_id) == "SUCCEEDED"
    assert_one_complete_trial(Path(printed[-1]).parent, out.stdout)


@pytest.fixture(scope="module")
def s3():
    with s3_server() as server:
        yield server


@pytest.mark.timeout(600)
def test_ray_job_submit_as_written_with_results_in_a_bucket(tiny_model, job_cluster, s3):
    """Guards issue 35 item 3: the literal `ray job submit --working-dir . -- vllm-sweep run
    SWEEP` from a checkout whose sweep keeps its results in an S3 bucket (a real S3 API server on
    loopback) and names the project's tiny model relatively, as the quickstart does, with no
    models/ in the checkout (git-ignored: never uploaded): Ray runs the job in its temporary
    copy, which is not refused (the results do not live there); the driver's node and the
    worker each build the tiny model in their copy (seeded: the same files); the trial runs on
    the worker, and its rows, its server's log (which says the worker built the model) and the
    study are in the bucket when the copy is gone."""
    c = job_cluster
    repo = c.tmp / "repo-s3"
    (repo / "sweeps").mkdir(parents=True)
    location = f"s3://{BUCKET}/jobs"
    spec = job_spec("models/tiny-llama", "search_spaces/tiny_cpu.yaml", location)
    (repo / "search_spaces").mkdir()
    shutil.copy(ROOT / "search_spaces" / "tiny_cpu.yaml", repo / "search_spaces")
    (repo / "sweeps" / "s3.yaml").write_text(yaml.safe_dump(spec))
    (repo / ".gitignore").write_text("/models\n/results/\n")
    job_id = f"vsweep-s3-{c.marker[:8]}"
    out = submit_job(c.dashboard, repo, job_id, c.env, timeout_s=240, sweep="sweeps/s3.yaml",
                     runtime_env={"env_vars": s3.env},  # the job's driver reaches the bucket
                     from_dir=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    status = wait_terminal(c.dashboard, job_id, timeout_s=480)
    logs = job_logs(c.dashboard, job_id)
    assert status == "SUCCEEDED", f"job status {status}; logs:\n{logs[-6000:]}"
    assert f"results: {location}/{NAME}" in logs, logs[-3000:]
    assert "built the project's tiny model at models/tiny-llama in Ray's copy" in logs
    assert not (repo / "results").exists() and not (repo / "models").exists()

    fs, prefix = s3.filesystem(), f"{BUCKET}/jobs/{NAME}"
    trials_data = ds.dataset(f"{prefix}/trials", filesystem=fs, partitioning="hive")  # noqa: F841
    trials = duckdb.sql("SELECT * FROM trials_data").df()
    assert len(trials) == 1 and trials.iloc[0]["state"] == "COMPLETE", trials
    assert trials.iloc[0]["completed"] == NUM_PROMPTS and trials.iloc[0]["node_ip"] == WORKER_IP
    names = {Path(i.path).name for i in fs.get_file_info(pafs.FileSelector(prefix, recursive=True))}
    assert {"optuna.journal", "origin.json", "trial-00000.log"} <= names, names
    server_log = fs.open_input_stream(f"{prefix}/logs/trial-00000.log").read().decode()
    assert "built the project's tiny model at models/tiny-llama in this node's copy" \
        in server_log, server_log[-2000:]
