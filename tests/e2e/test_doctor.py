"""`vllm-sweep doctor`: the check rows and exit code as pure functions of what the nodes
reported (table tests), the probe on this machine, and the command end to end on a two-node
emulated cluster (one passing run with one CPU server, one failing run that starts none)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.cli import cli_joined
from tests.cli import table_rows
from tests.clusters import emulated_cluster
from tests.paths import ROOT

# A node of the emulated cluster: one CPU (the doctor's CPU server is one bundle of
# cluster.cpus_per_worker = 1 CPU; fewer CPUs, fewer idle Ray workers started).
NODE = {"num_cpus": 1}


@pytest.fixture(scope="module")
def two_nodes():
    """Two emulated nodes of 1 CPU at loopback addresses 127.0.0.5 (head) and 127.0.0.6 (not
    127.0.0.1: Ray rewrites that address to the machine's own when joining): the fewest that
    show the doctor's per-node checks as per node (a check run on the driver's node only, or
    on one node for all, gives the second node's rows wrong); yields (address, marker, tmp)."""
    tmp = Path(tempfile.mkdtemp(prefix="vsd-"))
    try:
        with emulated_cluster(tmp, [{**NODE, "node_ip_address": "127.0.0.5"},
                                    {**NODE, "node_ip_address": "127.0.0.6"}]) as (
                _, address, marker):
            yield address, marker, tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_sweep(tmp: Path, model: Path, name: str, cache_dir: Path) -> Path:
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


@pytest.mark.server
@pytest.mark.timeout(600)
def test_doctor_passes_on_two_nodes(tiny_model, two_nodes):
    """Guards the doctor's per-node probe (every alive node's GPUs, cache dir and ports, one
    row each) and its CPU server started as a sweep starts one (launcher + run_trial)."""
    address, marker, tmp = two_nodes
    sweep = write_sweep(tmp, tiny_model, "ok", tmp / "cache")
    res = cli_joined(["doctor", str(sweep), "--address", address], tmp, marker, tmp)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-5000:]
    assert res.stdout.count("┏") == 1, out  # one table
    rows = table_rows(res.stdout)
    for ip in ("127.0.0.5", "127.0.0.6"):
        for check in ("GPUs", "cache dir", "server ports"):
            assert [ip, check, "ok"] in [r[:3] for r in rows], out
    server = next(r for r in rows if r[1] == "server TP=1 (CPU)")
    assert server[2] == "ok" and "20/20 requests ok" in server[3], out
    assert [r[2] for r in rows if r[1] in ("server TP=2", "server PP=2")] == ["skipped"] * 2
    assert "starting server" in out


@pytest.mark.server
@pytest.mark.timeout(300)
def test_doctor_fails_on_an_unwritable_cache_dir_without_starting_servers(tiny_model, two_nodes):
    """Guards a failed node check found on each node, and no server started after one."""
    address, marker, tmp = two_nodes
    (tmp / "a_file").write_text("")
    sweep = write_sweep(tmp, tiny_model, "bad", tmp / "a_file" / "cache")
    res = cli_joined(["doctor", str(sweep), "--address", address], tmp, marker, tmp)
    out = res.stdout + res.stderr
    assert res.returncode == 3, out[-5000:]
    rows = table_rows(res.stdout)
    for ip in ("127.0.0.5", "127.0.0.6"):
        row = next(r for r in rows if r[:2] == [ip, "cache dir"])
        assert row[2] == "FAIL" and "not writable" in row[3], out
    assert ["all nodes", "server TP=1 (CPU)", "skipped"] in [r[:3] for r in rows], out
    assert "starting server" not in out
