"""cluster.yaml against Ray 2.60's token authentication as the file sets it up (the head makes
the token, workers get the head's copy, `ray job submit` and vllm-sweep's own join present it).
Its GPU node types against the shipped sweeps' GPUs (no process started) are checked in
tests/unit/test_cluster_yaml.py, which also reads the file for these tests (`cluster`).

The token tests run the file's own token commands in a throwaway HOME, then re-enact its start
commands on this machine: a head and a worker from `ray start` with RAY_AUTH_MODE=token, a
`ray job submit` with and without the token, and a job that joins the cluster the way
vllm-sweep does (framework.cluster.RaySession). The pytest process never joins the cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.cli import cli_env
from tests.clusters import free_ports
from tests.clusters import ray_head_argv
from tests.procs import new_marker
from tests.procs import wait_no_marked_processes
from tests.ray_start import start_up
from tests.ray_start import stop_nodes
from tests.unit.test_cluster_yaml import cluster

VENV = Path(sys.executable).parent.parent
RAY = str(VENV / "bin" / "ray")


def fake_home(tmp: Path, name: str) -> Path:
    """A HOME whose ~/vllm-sweep-venv is this project's venv (the path cluster.yaml uses)."""
    home = tmp / name
    home.mkdir()
    (home / "vllm-sweep-venv").symlink_to(VENV)
    return home


def shell(command: str, home: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE")}
    env["HOME"] = str(home)
    return subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True,
                          timeout=120)


def token_commands() -> tuple[str, str]:
    """cluster.yaml's head command that makes the token and the worker's check for it."""
    cfg = cluster()
    make = next(c for c in cfg["head_start_ray_commands"] if "get-auth-token" in c)
    check = next(c for c in cfg["worker_start_ray_commands"] if "auth_token" in c)
    return make, check


@pytest.mark.timeout(300)
def test_head_makes_one_private_token_and_a_worker_without_it_stops_with_a_clear_error(
        short_tmp):
    make, check = token_commands()
    head = fake_home(short_tmp, "head")
    first = shell(make, head)
    assert first.returncode == 0, first.stderr[-2000:]
    token_file = head / ".ray" / "auth_token"
    token = token_file.read_text().strip()
    assert len(token) >= 32 and token not in first.stdout + first.stderr  # not in `ray up`'s log
    assert token_file.stat().st_mode & 0o777 == 0o600
    again = shell(make, head)
    assert again.returncode == 0 and token_file.read_text().strip() == token  # kept, not replaced

    worker = fake_home(short_tmp, "worker")
    missing = shell(check, worker)
    assert missing.returncode != 0 and "~/.ray/auth_token" in missing.stderr, missing
    (worker / ".ray").mkdir()
    shutil.copy2(token_file, worker / ".ray" / "auth_token")  # what cluster_synced_files does
    assert shell(check, worker).returncode == 0


_JOIN = """
import os, ray
from framework.cluster import RaySession
with RaySession(address=None):
    alive = sum(1 for n in ray.nodes() if n["Alive"])
    print(f"JOINED mode={os.environ['RAY_AUTH_MODE']} nodes={alive}", flush=True)
"""


def http_get(url: str, token: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:  # not listening yet
        return 0, str(exc)


def node_env(marker: str, tmp: Path, home: Path) -> dict[str, str]:
    """The start commands' environment: RAY_AUTH_MODE=token, the venv's bin first on PATH, and
    a HOME of the node's own (its ~/.ray/auth_token)."""
    env = cli_env(marker, tmp)
    for key in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS", "VLLM_TARGET_DEVICE"):
        env.pop(key, None)
    env.update({"RAY_AUTH_MODE": "token", "HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0",
                "PATH": f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"})
    return env


def wait_until(what: str, check, timeout_s: float, nodes: list[subprocess.Popen]) -> str:
    deadline, last = time.monotonic() + timeout_s, ""
    while time.monotonic() < deadline:
        for node in nodes:
            assert node.poll() is None, f"`ray start` {node.args} exited with {node.returncode}"
        done, last = check()
        if done:
            return last
        time.sleep(0.5)
    pytest.fail(f"{what} not within {timeout_s:.0f} s: {last}")


@pytest.mark.server
@pytest.mark.timeout(600)
def test_token_cluster_takes_jobs_only_with_the_token_and_vllm_sweep_joins_it(short_tmp):
    """The README's recipe on a loopback cluster: head and worker with RAY_AUTH_MODE=token (the
    worker with a copy of the head's token), the dashboard refusing requests without it,
    `ray job submit` working with RAY_AUTH_MODE=token + RAY_AUTH_TOKEN_PATH, and the job joining
    through vllm-sweep's RaySession with the mode it inherits from the head's `ray start`."""
    make, _ = token_commands()
    head_home, worker_home = fake_home(short_tmp, "hh"), fake_home(short_tmp, "wh")
    client_home = short_tmp / "ch"
    client_home.mkdir()
    assert shell(make, head_home).returncode == 0
    token_file = head_home / ".ray" / "auth_token"
    token = token_file.read_text().strip()
    (worker_home / ".ray").mkdir()
    shutil.copy2(token_file, worker_home / ".ray" / "auth_token")
    laptop_copy = client_home / "cluster.token"  # `ray rsync-down` of the head's token
    shutil.copy2(token_file, laptop_copy)

    marker = new_marker()
    head_env = node_env(marker, short_tmp, head_home)
    worker_env = node_env(marker, short_tmp, worker_home)
    client = {k: v for k, v in cli_env(marker, short_tmp).items()
              if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")}
    client["HOME"] = str(client_home)
    with_token = dict(client, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(laptop_copy))
    gcs_port, dash_port, agent_port, client_port, worker_agent_port = free_ports(5)
    gcs, dashboard = f"127.0.0.12:{gcs_port}", f"http://127.0.0.1:{dash_port}"
    (short_tmp / "h").mkdir()
    (short_tmp / "w").mkdir()
    head_argv = ray_head_argv(RAY, "127.0.0.12", [gcs_port, dash_port, agent_port, client_port],
                              short_tmp / "h", 1)
    worker_argv = [RAY, "start", "--address", gcs, "--node-ip-address", "127.0.0.2",
                   "--temp-dir", str(short_tmp / "w"), "--num-cpus", "1",
                   "--dashboard-agent-listen-port", str(worker_agent_port)]
    job_dir = short_tmp / "job"
    job_dir.mkdir()
    (job_dir / "join.py").write_text(_JOIN)
    nodes: list[subprocess.Popen] = []
    head_log, worker_log = short_tmp / "head.out", short_tmp / "worker.out"

    try:
        nodes.append(start_up(head_argv, head_env, head_log, timeout_s=180))
        wait_until("the dashboard", lambda: (http_get(f"{dashboard}/api/version", token)[0] == 200,
                                             "no answer"), 180, nodes)
        # A worker without the head's token is refused before it starts anything.
        bare = dict(worker_env, HOME=str(client_home))
        refused = subprocess.run(worker_argv, env=bare, capture_output=True, text=True,
                                 timeout=120)
        assert refused.returncode != 0, refused.stdout[-2000:]
        assert "token" in (refused.stdout + refused.stderr).lower()
        # registered: 2 alive nodes
        nodes.append(start_up([*worker_argv, "--block"], worker_env, worker_log, timeout_s=180))

        # A client outside the cluster (the laptop) joins the GCS with the token file: both
        # nodes alive (the worker is registered: its "Ray runtime started." line), by address:
        # a worker start that start_up retried may leave its first raylet alive in the GCS
        # until its health checks fail, a second raylet of the same address
        code = (f"import ray; ray.init(address={gcs!r}, logging_level='ERROR'); "
                "print('ALIVE', sorted({n['NodeManagerAddress'] for n in ray.nodes() "
                "if n['Alive']}))")
        joined = subprocess.run([sys.executable, "-c", code], env=with_token,
                                capture_output=True, text=True, timeout=300)
        assert "ALIVE ['127.0.0.12', '127.0.0.2']" in joined.stdout, \
            joined.stdout + joined.stderr[-2000:]

        assert http_get(f"{dashboard}/api/version")[0] == 401
        assert http_get(f"{dashboard}/api/version", "not-the-token")[0] == 403

        submit = ["job", "submit", "--address", dashboard, "--working-dir", str(job_dir)]
        no_token = subprocess.run([RAY, *submit, "--", "python", "join.py"], env=client,
                                  capture_output=True, text=True, timeout=120)
        assert no_token.returncode != 0
        assert "Authentication required" in no_token.stdout + no_token.stderr

        job_id = f"auth-{marker[:8]}"

        def submitted() -> tuple[bool, str]:
            out = subprocess.run([RAY, *submit, "--submission-id", job_id, "--no-wait", "--",
                                  "python", "join.py"], env=with_token, capture_output=True,
                                 text=True, timeout=120)
            text = out.stdout[-2000:] + out.stderr[-2000:]
            if out.returncode != 0 and "No available agent" not in text:
                pytest.fail(f"ray job submit with the token failed: {text}")
            return out.returncode == 0, text

        wait_until("the job submission", submitted, 120, nodes)

        def finished() -> tuple[bool, str]:
            code, body = http_get(f"{dashboard}/api/jobs/{job_id}", token)
            status = json.loads(body).get("status", "") if code == 200 else f"HTTP {code}"
            return status in ("SUCCEEDED", "FAILED", "STOPPED"), status

        status = wait_until("the job's end", finished, 300, nodes)
        job_logs = json.loads(http_get(f"{dashboard}/api/jobs/{job_id}/logs", token)[1])["logs"]
        assert status == "SUCCEEDED", f"{status}: {job_logs[-4000:]}"
        assert "JOINED mode=token nodes=2" in job_logs, job_logs[-4000:]
    finally:
        stop_nodes(nodes)
        left = wait_no_marked_processes(marker)
    assert left == [], left
