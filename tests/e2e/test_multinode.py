"""Real pipeline parallelism across two emulated Ray nodes (distinct loopback IPs), `vllm-sweep
doctor` on those nodes, and the contract of tests/isolated_nodes.py (#32) they keep: an isolated
node sees neither the head's files nor another node's, nor their processes, as another host would
not; the host reads what a node leaves in its TMPDIR.

The cluster is this module's (one for every test: none is about the cluster's own start, stop
or failure) and each command joins it through `cluster.address`: a head
from ray.cluster_utils that holds no CPU (the GCS, and the raylet of the driver, which runs in
this process), and two isolated nodes (tests/isolated_nodes.py, #32), each in its own mount and
PID namespace with its own TMPDIR, HOME and caches, every process tagged with a marker env var.
vLLM runs in-process in the trial's server actor with the Ray executor and the project's CPU
platform plugin; its two pipeline stages must land in the trial's two bundles, one per node.
Wherever the server actor lands, the other stage's node cannot read a file it wrote (nor the
driver's): a server that hands vLLM's workers a path on its own node fails here, as across real
hosts (vLLM's "File does not exist" for the logging config that eeb7f4a wrote).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.cli import cli_in_process
from tests.cli import cli_joined
from tests.cli import joined_cli_env
from tests.cli import table_rows
from tests.clusters import HEAD_IP
from tests.isolated_nodes import IsolatedCluster
from tests.isolated_nodes import isolated_cluster
from tests.leftovers import vsweep_leftovers
from tests.paths import ROOT
from tests.procs import marked_processes
from tests.sweeps import NO_REMEASURE
from tests.sweeps import read_trials

pytestmark = pytest.mark.server


NODES = ("127.0.0.2", "127.0.0.3")


@pytest.fixture(scope="module")
def two_node_cluster() -> Iterator[IsolatedCluster]:
    """A head with no CPU and two isolated nodes at 127.0.0.2 and 127.0.0.3 (1 CPU each), all
    under one short private folder (`cluster_dir`: every test's driver files go in a folder of
    it, which the nodes do not see). The head stays in this process's namespaces, so it would
    see the nodes' files: it takes no trial work."""
    parent = Path(tempfile.mkdtemp(prefix="vst-mn-"))  # short: Ray's socket paths
    try:
        with isolated_cluster(parent, {"num_cpus": 0},
                              [{"ip": ip, "num_cpus": 1} for ip in NODES]) as cluster:
            yield cluster
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def cluster_dir(cluster: IsolatedCluster) -> Path:
    """The folder every node's folder lies in (the head's Ray folder too)."""
    return cluster.nodes[0].folder.parent


# Pinned to each node: write a file in the task's TMPDIR. Pinned to each node again: where its
# TMPDIR and HOME are, which of those files it sees, and the raylets in its process table.
PROBE = """
import json, os, sys, tempfile
import psutil, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as On

ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
node_of = {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}

@ray.remote(num_cpus=0)
def write(name):
    path = os.path.join(tempfile.gettempdir(), name)
    with open(path, "w") as f:
        f.write(name)
    return path

@ray.remote(num_cpus=0)
def look(paths):
    raylets = []  # the node address each raylet in this process table serves
    for p in psutil.process_iter():
        try:
            if p.name() == "raylet":
                raylets += [a.split("=", 1)[1] for a in p.cmdline()
                            if a.startswith("--node_ip_address=")]
        except psutil.Error:
            pass
    return {"tmp": tempfile.gettempdir(), "home": os.path.expanduser("~"),
            "sees": {p: os.path.exists(p) for p in paths}, "raylets": raylets}

ips = sys.argv[2:]
files = {ip: ray.get(write.options(scheduling_strategy=On(node_of[ip], soft=False)).remote(
    "from-" + ip)) for ip in ips}
views = {ip: ray.get(look.options(scheduling_strategy=On(node_of[ip], soft=False)).remote(
    list(files.values()))) for ip in ips}
print(json.dumps({"files": files, "views": views}))
"""


@pytest.mark.timeout(300)
def test_isolated_node_sees_neither_the_heads_files_nor_its_processes(two_node_cluster):
    """Guards #32's emulation: an emulated node that could read a file only another node (or
    the head) has, or find another node's raylet, lets a multi-node test pass where real hosts
    fail (vLLM's workers read a logging config only the server actor's node had)."""
    cluster = two_node_cluster
    node, other = cluster.nodes
    res = subprocess.run([sys.executable, "-c", PROBE, cluster.address, HEAD_IP, *NODES],
                         capture_output=True, text=True, timeout=180,
                         env=dict(os.environ, RAY_ADDRESS=""))
    assert res.returncode == 0, res.stderr[-3000:] + node.log_tail() + other.log_tail()
    seen = json.loads(res.stdout.strip().splitlines()[-1])
    files, views = seen["files"], seen["views"]
    head_file, node_file, other_file = files[HEAD_IP], files[node.ip], files[other.ip]
    on_head, on_node, on_other = views[HEAD_IP], views[node.ip], views[other.ip]

    # Each node's TMPDIR is its own folder under the cluster's; the node's HOME is its folder.
    assert on_head["tmp"] == str(cluster_dir(cluster) / "head")
    assert on_node["tmp"] == on_node["home"] == str(node.folder)
    assert on_other["tmp"] == on_other["home"] == str(other.folder)
    # The head's file is not on an isolated node, nor is anything else of the cluster's
    # folder: another node's file neither.
    assert on_head["sees"][head_file] is True
    assert on_node["sees"] == {head_file: False, node_file: True, other_file: False}
    assert on_other["sees"] == {head_file: False, node_file: False, other_file: True}
    # The host reads a node's TMPDIR (the leftovers checks): the node's file is there.
    assert (node.folder / f"from-{node.ip}").read_text() == f"from-{node.ip}"
    # A node's process table holds its own raylet only; the head's shows every node's.
    assert on_node["raylets"] == [node.ip] and on_other["raylets"] == [other.ip]
    assert {HEAD_IP, *NODES} <= set(on_head["raylets"]), on_head["raylets"]


PROMPTS = 8  # each crosses both stages; more only add load time
# PP on CPU needs a compiled model: --enforce-eager skips the warm-up that allocates the
# inter-stage buffers. Dynamo traced once and run eagerly keeps that warm-up without
# inductor's code generation (what vLLM's own CPU CI runs: vllm/platforms/cpu.py).
EAGER_TRACE = json.dumps({"mode": 2, "backend": "eager"})


def write_pp_sweep(tmp: Path, model: Path, address: str) -> Path:
    space = tmp / "pp_space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        "pipeline-parallel-size": {"type": "categorical", "choices": [2], "default": 2},
        "max-num-seqs": {"type": "categorical", "choices": [16], "default": 16},
    }}))
    sweep = tmp / "pp.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "pp", "model": str(model), "search_space": str(space),
        "server": {"args": {"max-model-len": 512, "compilation-config": EAGER_TRACE},
                   "host": "node", "startup_timeout_s": 420},
        "workload": {"num_prompts": PROMPTS, "input_len": 64, "output_len": 16,
                     "max_concurrency": 4, "warmup_requests": 2},
        "sla": {"p99_ttft_ms": 60000},
        "search": {**NO_REMEASURE, "n_trials": 1, "baseline": False},
        "cluster": {"address": address, "cpus_per_worker": 1},
        "results_dir": str(tmp / "results"),
    }))
    return sweep


@pytest.mark.timeout(900)
def test_pipeline_stages_span_two_nodes(tiny_model, two_node_cluster):
    """Guards #32 defect 1: a PP = 2 server whose stages cannot reach each other's files (the
    logging config eeb7f4a handed vLLM's workers) or that caches under the driver's folder
    (168b50e); one trial on the smallest layout that splits a server across two hosts."""
    address, marker = two_node_cluster.address, two_node_cluster.marker
    # The driver's folder lies in the cluster's: no node sees it, as on real hosts.
    tmp = cluster_dir(two_node_cluster) / "pp"
    tmp.mkdir()
    sweep = write_pp_sweep(tmp, tiny_model, address)
    # No VLLM_SWEEP_CACHE_DIR of this machine's (the repository's .cache, which every emulated
    # node would share): the servers' caches take sweep/loader.py cache_dir's default, a path
    # under the driver's folder or a node's HOME, private to each node here as on real hosts.
    env = joined_cli_env(marker, tmp, cluster_dir(two_node_cluster))
    env.pop("VLLM_SWEEP_CACHE_DIR", None)
    res = cli_in_process("run", str(sweep), cwd=tmp, env=env)
    log = (tmp / "results/pp/logs/trial-00000.log")
    log_text = log.read_text() if log.exists() else ""
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:] + log_text[-3000:]
    trials = read_trials(tmp / "results", "pp")
    row = trials.iloc[0]
    assert row["state"] == "COMPLETE", (row["fail_reason"], row["fail_detail"], log_text[-3000:])
    assert row["completed"] == PROMPTS
    placement = list(row["placement"])
    assert len(placement) == 2 and len(set(placement)) == 2, placement
    assert row["node_count"] == 2
    argv = list(row["vllm_argv"])
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"
    assert argv[argv.index("--distributed-executor-backend") + 1] == "ray"
    # vLLM reused the trial's group instead of creating its own, and loaded our plugin.
    assert "existing placement group" in log_text.lower() or "current placement group" in log_text.lower()
    assert "vllm-sweep CPU Ray platform plugin active" in log_text
    # Nothing of the trial is left: no vLLM process among the cluster's processes, once the
    # stopped ones have exited (polled as tests/procs.py wait_no_trial_processes polls: a
    # loaded machine may still be reaping them when the run returns)
    deadline = time.monotonic() + 45
    while (leftovers := trial_leftovers(marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert leftovers == []
    # Nor any of the server's files in either node's TMPDIR.
    for node in two_node_cluster.nodes:
        assert vsweep_leftovers(node.folder) == [], node.ip
    # A joined cluster's servers cache under their node's HOME, not the driver's directory.
    assert not (tmp / ".cache").exists() and not (cluster_dir(two_node_cluster) / ".cache").exists()
    assert any((node.folder / ".cache" / "vllm-sweep" / "vllm").is_dir()
               for node in two_node_cluster.nodes)


def trial_leftovers(marker: str) -> list[str]:
    """The cluster's processes (by its marker) that are vLLM's or a server actor's, described."""
    leftovers = []
    for proc in marked_processes(marker):
        try:
            text = " ".join(proc.cmdline()) + proc.name()
        except Exception:  # noqa: BLE001 - exited meanwhile
            continue
        if "VLLM" in text or "ServerActor" in text or "RayWorker" in text:
            leftovers.append(text[:120])
    return leftovers


def write_doctor_sweep(tmp: Path, model: Path, name: str, cache_dir: Path) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name, "model": str(model),
        "search_space": str(ROOT / "search_spaces" / "tiny_cpu.yaml"),
        "server": {"args": {"enforce-eager": True, "max-model-len": 512},
                   "startup_timeout_s": 300},
        "workload": {"num_prompts": 40, "input_len": 64, "output_len": 16, "max_concurrency": 8},
        "cluster": {"cache_dir": str(cache_dir)},
        "results_dir": str(tmp / "results"),
    }))
    return path


def doctor_folder(cluster: IsolatedCluster, name: str) -> Path:
    """A driver's folder in the cluster's, which no isolated node sees."""
    tmp = cluster_dir(cluster) / name
    tmp.mkdir()
    return tmp


@pytest.mark.timeout(600)
def test_doctor_passes_on_isolated_nodes(tiny_model, two_node_cluster):
    """Guards the doctor's per-node probe (every alive node's GPUs, cache dir and ports, one
    row each; a check run on the driver's node only, or one node's for all, gives another
    node's rows wrong) and its CPU server started as a sweep starts one (launcher + run_trial),
    on nodes that see none of the driver's files (#32: the doctor on nodes apart as hosts)."""
    cluster = two_node_cluster
    tmp = doctor_folder(cluster, "doctor-ok")
    sweep = write_doctor_sweep(tmp, tiny_model, "ok", tmp / "cache")
    res = cli_joined(["doctor", str(sweep), "--address", cluster.address], tmp, cluster.marker,
                     cluster_dir(cluster))
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-5000:]
    assert res.stdout.count("┏") == 1, out  # one table
    rows = table_rows(res.stdout)
    for ip in (HEAD_IP, *NODES):
        for check in ("GPUs", "cache dir", "server ports"):
            assert [ip, check, "ok"] in [r[:3] for r in rows], out
    server = next(r for r in rows if r[1] == "server TP=1 (CPU)")
    assert server[2] == "ok" and "20/20 requests ok" in server[3], out
    assert [r[2] for r in rows if r[1] in ("server TP=2", "server PP=2")] == ["skipped"] * 2
    assert "starting server" in out
    for node in cluster.nodes:  # the server left nothing in its node's TMPDIR
        assert vsweep_leftovers(node.folder) == [], node.ip


@pytest.mark.timeout(300)
def test_doctor_fails_on_an_unwritable_cache_dir_without_starting_servers(tiny_model,
                                                                           two_node_cluster):
    """Guards a failed node check found on each node, and no server started after one. The
    cache dir lies under /dev/null, a file on every node (a file of the driver's folder would
    not be one on an isolated node, as on another host)."""
    cluster = two_node_cluster
    tmp = doctor_folder(cluster, "doctor-bad")
    sweep = write_doctor_sweep(tmp, tiny_model, "bad", Path("/dev/null/cache"))
    res = cli_joined(["doctor", str(sweep), "--address", cluster.address], tmp, cluster.marker,
                     cluster_dir(cluster))
    out = res.stdout + res.stderr
    assert res.returncode == 3, out[-5000:]
    rows = table_rows(res.stdout)
    for ip in (HEAD_IP, *NODES):
        row = next(r for r in rows if r[:2] == [ip, "cache dir"])
        assert row[2] == "FAIL" and "not writable" in row[3], out
    assert ["all nodes", "server TP=1 (CPU)", "skipped"] in [r[:3] for r in rows], out
    assert "starting server" not in out
