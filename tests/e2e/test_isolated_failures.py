"""Failures of a sweep spread over two isolated nodes (tests/isolated_nodes.py, #32: each node
in its own mount and PID namespace, its own TMPDIR and HOME), FakeEngine servers (the named
stand-in: what is under test is what the driver, Ray and the next run do, not vLLM):

- #33's acceptance: kill -9 of the driver while a server runs on each node, then a new run:
  nothing of the killed run is left on either node, no process and no file;
- a node that dies during a trial (its whole process table at once, as a machine failure):
  that trial ends FAIL(node_lost) naming the node, and the sweep goes on on the node left;
- prefill/decode across the two nodes: a KV folder that is not shared is refused before
  anything starts; a shared one carries the KV from P's node to D's.

One cluster for the module (a head that holds no GPU, the GCS, which cannot die; two isolated
nodes of one fake GPU each); the node-loss test runs last, since it takes a node away. The
drivers' folders lie in the cluster's folder, which no node sees. FakeEngine's hold file lies
outside it, where every node reads it (a test's channel to the servers, as a shared file
system would be)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest
import yaml

from framework.base.exit_codes import EXIT_CLUSTER
from framework.trial import measure
from tests.cli import cli_joined
from tests.cli import end_driver
from tests.cli import joined_cli_env
from tests.cli import kill_driver
from tests.cli import read_until
from tests.cli import start_driver
from tests.isolated_nodes import IsolatedCluster
from tests.isolated_nodes import isolated_cluster
from tests.isolated_nodes import stop_node
from tests.leftovers import vsweep_leftovers
from tests.sweeps import NO_REMEASURE
from tests.sweeps import read_requests
from tests.sweeps import read_trials

pytestmark = pytest.mark.server

NODES = ("127.0.0.6", "127.0.0.7")


@pytest.fixture(scope="module")
def cluster() -> Iterator[IsolatedCluster]:
    parent = Path(tempfile.mkdtemp(prefix="vst-if-"))  # short: Ray's socket paths
    try:
        with isolated_cluster(parent, {"num_cpus": 1, "num_gpus": 0},
                              [{"ip": ip, "num_cpus": 1, "num_gpus": 1} for ip in NODES]) as c:
            yield c
    finally:
        shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture
def hold_folder() -> Iterator[Path]:
    """A private folder outside the cluster's, for FakeEngine's hold file."""
    path = Path(tempfile.mkdtemp(prefix="vst-hold-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def driver_folder(cluster: IsolatedCluster, name: str) -> Path:
    """A driver's folder inside the cluster's folder: no isolated node sees it."""
    path = cluster.nodes[0].folder.parent / name
    path.mkdir()
    return path


def write_sweep(tmp: Path, model: Path, address: str, name: str, concurrent: int,
                env: dict[str, str], cluster: dict | None = None) -> Path:
    space = tmp / "space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        "max-num-seqs": {"type": "categorical", "choices": [2, 4, 8]}}}))
    sweep = tmp / f"{name}.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": name, "model": str(model), "search_space": str(space), "engine": "fake",
        "server": {"host": "node", "reuse": False,
                   "env": {"FAKE_ENGINE_STARTUP_S": "0", "FAKE_ENGINE_TPOT_MS": "40", **env}},
        # ~8 s of load a trial (4 waves of 2 s) unless held
        "workload": {"num_prompts": 8, "input_len": 8, "output_len": 50,
                     "max_concurrency": 2, "warmup_requests": 0, "request_timeout_s": 30},
        "sla": {"p99_ttft_ms": 60000},
        "search": {**NO_REMEASURE, "sampler": "grid", "n_trials": 2, "baseline": False},
        "cluster": {"address": address, "max_concurrent_trials": concurrent, **(cluster or {})},
        "results_dir": str(tmp / "results"),
    }))
    return sweep


def run_processes(cluster: IsolatedCluster) -> dict[str, list[psutil.Process]]:
    """Per node: the processes of a sweep's server there (its server actor, FakeEngine and any
    child of theirs)."""
    found: dict[str, list[psutil.Process]] = {}
    for node in cluster.nodes:
        found[node.ip] = []
        for proc in node.processes():
            try:
                text = " ".join(proc.cmdline()) + " " + proc.name()
            except psutil.Error:
                continue
            if "fake_engine" in text or "ServerActor" in text:
                found[node.ip].append(proc)
    return found


def running(procs: list[psutil.Process]) -> list[int]:
    """The pids of `procs` still running: a zombie has ended (its parent, not this test's, has
    yet to reap it), which is_running() alone does not tell."""
    left = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(proc.pid)
        except psutil.NoSuchProcess:
            continue
    return left


def wait_ended(procs: list[psutil.Process], timeout_s: float = 30.0) -> list[int]:
    """Poll until every one of `procs` has ended (gone or a zombie); returns the pids left."""
    deadline = time.monotonic() + timeout_s
    while (left := running(procs)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.mark.timeout(600)
def test_kill_9_of_the_driver_on_two_nodes_then_a_new_run_leaves_nothing_of_it(
        tiny_model, cluster, hold_folder):
    """Guards #33 finding 7: a driver killed with kill -9 cleans nothing, so the next run must
    end the killed run's processes and remove its run folders on every node, not only on the
    driver's (the old take-over did the driver's node alone; a node's folder the driver cannot
    see). Two trials side by side, one server per node, held under load when the kill comes."""
    hold = hold_folder / "hold-tokens"
    hold.touch()
    tmp = driver_folder(cluster, "k9")
    sweep = write_sweep(tmp, tiny_model, cluster.address, "k9", concurrent=2,
                        env={"FAKE_ENGINE_HOLD_TOKENS": str(hold)})
    env = joined_cli_env(cluster.marker, tmp, cluster.nodes[0].folder.parent)
    proc = start_driver(sweep, tmp, env)
    try:
        seen = ""
        for number in (0, 1):
            if f"trial {number}: under load" not in seen:
                seen += read_until(proc, f"trial {number}: under load", timeout_s=240)
            assert f"trial {number}: under load" in seen, seen
        before = run_processes(cluster)
        folders = {node.ip: vsweep_leftovers(node.folder) for node in cluster.nodes}
        # the premise: the run has a server and a run folder on each node
        assert all(before.values()), before
        assert all(folders.values()), folders
        kill_driver(proc)  # the driver alone: Ray and the nodes are left
    finally:
        end_driver(proc)
    hold.unlink()

    # one trial more than the study holds once the killed run's two are closed (counted before
    # they were, --add-trials 1 ran nothing: the grid's 2 trials were "done")
    again = cli_joined(["run", str(sweep), "--add-trials", "1"], tmp, cluster.marker,
                       cluster.nodes[0].folder.parent)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    trials = read_trials(tmp / "results", "k9")
    assert list(trials["trial_number"]) == [0, 1, 2]
    assert list(trials["fail_reason"].fillna(""))[:2] == ["interrupted"] * 2
    assert trials.iloc[2]["state"] == "COMPLETE"
    for node in cluster.nodes:
        assert wait_ended(before[node.ip]) == [], node.ip
        assert vsweep_leftovers(node.folder) == [], node.ip


@pytest.mark.timeout(600)
def test_prefill_and_decode_on_two_nodes_need_a_folder_both_nodes_see(tiny_model, cluster,
                                                                       hold_folder):
    """Guards #36's prefill/decode across nodes (FakeEngine fakes ExampleConnector's contract:
    P saves each prompt's KV as files, D loads them): cluster.shared_folder set to a path only
    the driver's node has (each node its own, as /tmp/kv on real hosts) is refused before any
    server starts, naming a node that does not see it; set to a folder every node sees (the
    hold folder, outside the cluster's: a shared file system here), the 1P1D trial runs with P
    and D on different nodes (one fake GPU each, and D asked to avoid P's node, which checks
    Ray takes the `!in(...)` node selector) and D loads every request's KV from P's node; the
    trial's private KV folder in it is removed with the trial."""
    tmp = driver_folder(cluster, "pd")
    local = tmp / "kv"  # the driver sees it; on each isolated node, an empty folder of its own
    local.mkdir()
    sweep = write_sweep(tmp, tiny_model, cluster.address, "pd", concurrent=1, env={},
                        cluster={"shared_folder": str(local)})
    doc = yaml.safe_load(sweep.read_text())
    # FakeEngine counts a prompt's words as its tokens (its usage.prompt_tokens) and moves
    # whole blocks of 16 of them but the last (fake_engine.kv_exchange): 200 tokens of the
    # tiny model's tokenizer make enough words for several blocks
    doc["workload"]["input_len"] = 200
    doc["search"]["n_trials"] = 1
    sweep.write_text(yaml.safe_dump(doc))
    (tmp / "space.yaml").write_text(yaml.safe_dump({"parameters": {
        "prefill-servers": {"type": "categorical", "choices": [1], "kind": "shape"}}}))

    refused = cli_joined(["run", str(sweep)], tmp, cluster.marker, cluster.nodes[0].folder.parent)
    assert refused.returncode == EXIT_CLUSTER, refused.stdout[-3000:] + refused.stderr[-3000:]
    line = refused.stderr.strip().splitlines()[-1]
    assert "cluster.shared_folder" in line and str(local) in line and "does not see" in line
    assert any(ip in line for ip in NODES), line
    assert not list((tmp / "results").rglob("*.parquet"))  # no trial ran
    assert list(local.iterdir()) == []  # the check's own file went with it

    doc["cluster"]["shared_folder"] = str(hold_folder)
    sweep.write_text(yaml.safe_dump(doc))
    done = cli_joined(["run", str(sweep)], tmp, cluster.marker, cluster.nodes[0].folder.parent)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (row,) = read_trials(tmp / "results", "pd").itertuples()
    assert row.state == "COMPLETE", (row.fail_reason, row.fail_detail)
    assert row.shape == "1P1DxTP1xPP1"
    assert sorted(row.placement) == sorted(NODES)  # P on one node, D on the other
    requests = read_requests(tmp / "results", "pd")
    assert len(requests) == 8
    moved = sum((n - 2) // 16 * 16 for n in requests["prompt_tokens"])
    assert moved > 0 and row.kv_transfer_tokens == moved  # every request's KV, from P's node
    assert list(hold_folder.iterdir()) == []


@pytest.mark.timeout(600)
def test_node_lost_mid_trial_fails_that_trial_and_the_sweep_completes(tiny_model, cluster,
                                                                      monkeypatch):
    """Guards: a trial whose node dies under load must end as FAIL(node_lost) naming that node
    (not hang, not crash the driver, not record a measurement), and with retry_node_lost the
    sweep must run that configuration once more, on the node left, to completion. One trial
    (plus its retry): its node, whichever Ray picked, is the one that dies, from inside the
    run as the trial's load starts (the load generator's entry, wrapped here: the sweep runs
    in this process), so no output line or time is waited for."""
    killed: list[str] = []
    real = measure.run_load

    async def load_while_its_node_dies(base_url, model, requests, **kwargs):
        """The first trial's load, while its server's node dies (host: node, so the server's
        address is its node's): the load is under way when the kill lands, ~8 s before it
        could end."""
        if killed:
            return await real(base_url, model, requests, **kwargs)
        ip = urlsplit(base_url).hostname
        doomed = next(n for n in cluster.nodes if n.ip == ip)
        killed.append(ip)
        load = asyncio.ensure_future(real(base_url, model, requests, **kwargs))
        left = await asyncio.to_thread(stop_node, doomed)  # its whole process table at once
        assert left == [], left
        return await load

    monkeypatch.setattr(measure, "run_load", load_while_its_node_dies)
    tmp = driver_folder(cluster, "loss")
    sweep = write_sweep(tmp, tiny_model, cluster.address, "loss", concurrent=1, env={},
                        cluster={"retry_node_lost": True})
    doc = yaml.safe_load(sweep.read_text())
    doc["search"].update(sampler="random", n_trials=1)
    sweep.write_text(yaml.safe_dump(doc))
    res = cli_joined(["run", str(sweep)], tmp, cluster.marker, cluster.nodes[0].folder.parent)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    (doomed_ip,) = killed
    (survivor,) = set(NODES) - {doomed_ip}
    trials = read_trials(tmp / "results", "loss")
    assert len(trials) == 2, out[-4000:]  # 1 trial + the lost one's configuration run once more
    lost = trials[trials["fail_reason"] == "node_lost"]
    assert len(lost) == 1, trials[["trial_number", "state", "fail_reason", "fail_detail",
                                   "placement"]].to_string()
    number = int(lost.iloc[0]["trial_number"])
    assert f"trial {number}: under load" in out, out[-4000:]  # it died under load
    assert doomed_ip in lost.iloc[0]["fail_detail"]
    rest = trials[trials["fail_reason"] != "node_lost"]
    assert (rest["state"] == "COMPLETE").all()
    later = rest[rest["trial_number"] > number]
    assert len(later) == 1 and all(list(p) == [survivor] for p in later["placement"])
    retry = trials[trials["trial_number"] == number + 1].iloc[0]
    assert retry["param_max_num_seqs"] == lost.iloc[0]["param_max_num_seqs"]
    assert retry["state"] == "COMPLETE"
