"""`vllm-sweep doctor`: the check rows and exit code as pure functions of what the nodes
reported (table tests), the probe on this machine, and the command end to end on a two-node
emulated cluster (one passing run with one CPU server, one failing run that starts none)."""

from __future__ import annotations

import io
from dataclasses import replace
from datetime import UTC
from datetime import datetime
from pathlib import Path

import pytest
from rich.console import Console

from framework.cluster import node_report
from framework.cluster.node_report import Gpu
from framework.cluster.node_report import NodeReport
from framework.cluster.placement import Shape
from framework.load.loadgen import RequestRecord
from framework.sweep import doctor
from framework.sweep.doctor import FAIL
from framework.sweep.doctor import OK
from framework.sweep.doctor import SKIPPED
from framework.sweep.doctor import Check
from framework.sweep.doctor import ServerPlan
from framework.trial.measure import LoadStep
from framework.trial.run import TrialOutcome
from tests.cli import table_rows
from tests.paths import ROOT

VERSIONS = {"vllm": "0.32.0", "torch": "2.13.0", "cuda": "12.8", "ray": "2.60.0",
            "python": "3.11.7"}


A100 = Gpu("NVIDIA A100-SXM4-80GB", 79.3)


H100 = Gpu("NVIDIA H100 80GB HBM3", 79.1)


def node(ip: str, gpus: int = 0, gpu: Gpu = A100, visible: int | None = None,
         **changes) -> NodeReport:
    """A healthy node's report: `gpus` GPUs in Ray and visible to torch (unless `visible`)."""
    report = NodeReport(node_ip=ip, resources={"CPU": 8.0, f"node:{ip}": 1.0, "GPU": float(gpus)},
                        gpus=(gpu,) * gpus, cuda_visible=gpus if visible is None else visible,
                        versions=VERSIONS, cache_dir="/home/u/.cache/vllm-sweep", free_ports=4)
    return replace(report, **changes)


def by_check(rows: list[Check]) -> dict[tuple[str, str], Check]:
    return {(r.node, r.check): r for r in rows}


def test_healthy_gpu_nodes_pass_with_one_row_per_node_and_check():
    rows = doctor.node_checks([node("10.0.0.2", 8), node("10.0.0.1", 8)], "gpu")
    assert [(r.node, r.check) for r in rows] == [
        ("10.0.0.1", "GPUs"), ("10.0.0.1", "cache dir"), ("10.0.0.1", "server ports"),
        ("10.0.0.2", "GPUs"), ("10.0.0.2", "cache dir"), ("10.0.0.2", "server ports"),
        ("all nodes", "versions")]
    assert {r.result for r in rows} == {OK}
    assert by_check(rows)[("10.0.0.1", "GPUs")].detail == "8 x NVIDIA A100-SXM4-80GB (79.3 GiB)"
    assert doctor.exit_code(rows, 3) == 0


@pytest.mark.parametrize("reports, wanted", [
    ([node("10.0.0.1"), node("10.0.0.2", versions={**VERSIONS, "torch": "2.12.0"})],
     "torch differs: 2.13.0 on 10.0.0.1; 2.12.0 on 10.0.0.2"),
    ([node("10.0.0.1"), node("10.0.0.2"), node("10.0.0.3", versions={**VERSIONS, "ray": "2.59.0",
                                                                    "cuda": "12.4"})],
     "cuda differs: 12.8 on 10.0.0.1, 10.0.0.2; 12.4 on 10.0.0.3 | ray differs: 2.60.0 on "
     "10.0.0.1, 10.0.0.2; 2.59.0 on 10.0.0.3"),
    ([node("10.0.0.1", versions={**VERSIONS, "vllm": "missing"})],
     "vllm is not installed on 10.0.0.1"),
])
def test_version_mismatch_is_a_failure_naming_nodes_and_versions(reports, wanted):
    row = doctor.version_check(reports)
    assert (row.node, row.check, row.result, row.detail) == ("all nodes", "versions", FAIL, wanted)
    assert doctor.exit_code(doctor.node_checks(reports, "cpu"), 3) == 3


def test_equal_versions_are_listed_once():
    row = doctor.version_check([node("10.0.0.1"), node("10.0.0.2")])
    assert row.result == OK
    assert row.detail == ("vllm 0.32.0, torch 2.13.0, cuda 12.8, ray 2.60.0, python 3.11.7 "
                          "on 2 node(s)")


@pytest.mark.parametrize("report, engine, result, detail", [
    (node("10.0.0.1"), "gpu", OK, "no GPU"),  # a CPU head on a GPU cluster
    (node("10.0.0.1", 2, visible=0), "gpu", FAIL,
     "Ray offers 2 GPU(s) but torch.cuda sees no CUDA device (torch 2.13.0, CUDA 12.8); "
     "nvidia-smi: 2 x NVIDIA A100-SXM4-80GB (79.3 GiB)"),
    (node("10.0.0.1", 4, visible=2), "gpu", FAIL,
     "Ray offers 4 GPU(s) but torch.cuda sees only 2 CUDA device(s) (torch 2.13.0, CUDA 12.8); "
     "nvidia-smi: 4 x NVIDIA A100-SXM4-80GB (79.3 GiB)"),
    (node("10.0.0.1", 2, visible=0), "cpu", OK,
     "2 x NVIDIA A100-SXM4-80GB (79.3 GiB) (the CPU engine uses none)"),
    (node("10.0.0.1", 1, resources={"CPU": 8.0}), "gpu", OK,
     "1 x NVIDIA A100-SXM4-80GB (79.3 GiB); Ray offers none of them to trials"),
    (node("10.0.0.1", resources={"GPU": 4.0}), "fake", OK,
     "no GPU; Ray offers 4 (the fake engine uses none)"),
])
def test_gpu_check(report, engine, result, detail):
    row = doctor.gpu_check(report, engine)
    assert (row.node, row.check, row.result, row.detail) == ("10.0.0.1", "GPUs", result, detail)


def test_unwritable_cache_dir_and_too_few_ports_fail_on_their_node():
    rows = by_check(doctor.node_checks(
        [node("10.0.0.1"), node("10.0.0.2", cache_error="not writable: Permission denied",
                                free_ports=1)], "cpu"))
    assert rows[("10.0.0.1", "cache dir")].result == OK
    assert rows[("10.0.0.2", "cache dir")] == Check(
        "10.0.0.2", "cache dir", FAIL, "/home/u/.cache/vllm-sweep: not writable: Permission denied")
    assert rows[("10.0.0.2", "server ports")] == Check(
        "10.0.0.2", "server ports", FAIL, "1 of 4 picked ports free in 20000-29999")
    assert doctor.exit_code(list(rows.values()), 3) == 3


def test_a_failed_probe_is_one_failure_row_and_its_node_is_left_out_of_versions():
    rows = doctor.node_checks([node("10.0.0.1"), NodeReport("10.0.0.2", error="probe failed: x")],
                              "cpu")
    assert Check("10.0.0.2", "probe", FAIL, "probe failed: x") in rows
    assert rows[-1].result == OK and rows[-1].detail.endswith("on 1 node(s)")


def test_skipped_rows_do_not_fail():
    rows = [Check("driver", "results dir", OK, ""), Check("all nodes", "server TP=2", SKIPPED, "")]
    assert doctor.exit_code(rows, 3) == 0
    assert doctor.exit_code([*rows, Check("n", "x", FAIL, "")], 3) == 3


def test_writable(tmp_path):
    assert node_report.writable(tmp_path / "new" / "cache") == ""
    assert (tmp_path / "new" / "cache").is_dir()
    (tmp_path / "a_file").write_text("")  # root may write anywhere, but not under a file
    assert node_report.writable(tmp_path / "a_file" / "cache").startswith("not writable: ")


def test_parse_nvidia_smi():
    text = "NVIDIA A100-SXM4-80GB, 81920\nNVIDIA A100-SXM4-80GB, 81920\n\nNo devices were found\n"
    assert node_report.parse_nvidia_smi(text) == (Gpu("NVIDIA A100-SXM4-80GB", 80.0),) * 2


def test_cpu_engine_plans_one_server_and_skips_tp_and_pp():
    planned = doctor.plan_servers([node("127.0.0.1"), node("127.0.0.2")], "cpu")
    assert planned == [ServerPlan("server TP=1 (CPU)"),
                       Check("all nodes", "server TP=2", SKIPPED, doctor.CPU_SKIP),
                       Check("all nodes", "server PP=2", SKIPPED, doctor.CPU_SKIP)]
    assert doctor.CPU_SKIP == "CPU engine: TP/PP checks need GPUs"


@pytest.mark.parametrize("reports, wanted", [
    ([node("10.0.0.1"), node("10.0.0.2", 8), node("10.0.0.3", 8)],
     [ServerPlan("server TP=1 (NVIDIA A100-SXM4-80GB)", Shape(), ("10.0.0.2",)),
      ServerPlan("server TP=2", Shape(tp=2), ("10.0.0.2", "10.0.0.2")),
      ServerPlan("server PP=2", Shape(pp=2), ("10.0.0.2", "10.0.0.3"))]),
    ([node("10.0.0.1", 1), node("10.0.0.2", 1, gpu=H100)],
     [ServerPlan("server TP=1 (NVIDIA A100-SXM4-80GB)", Shape(), ("10.0.0.1",)),
      ServerPlan("server TP=1 (NVIDIA H100 80GB HBM3)", Shape(), ("10.0.0.2",)),
      Check("all nodes", "server TP=2", SKIPPED, "no node offers 2 GPUs"),
      ServerPlan("server PP=2", Shape(pp=2), ("10.0.0.1", "10.0.0.2"))]),
    ([node("10.0.0.1", 2)],
     [ServerPlan("server TP=1 (NVIDIA A100-SXM4-80GB)", Shape(), ("10.0.0.1",)),
      ServerPlan("server TP=2", Shape(tp=2), ("10.0.0.1", "10.0.0.1")),
      Check("all nodes", "server PP=2", SKIPPED, "needs 2 nodes with a GPU, the cluster has 1")]),
    ([node("10.0.0.1")], [Check("all nodes", "servers", FAIL, "Ray offers no GPU on any node")]),
])
def test_gpu_servers_per_gpu_type_and_where_the_cluster_has_room(reports, wanted):
    assert doctor.plan_servers(reports, "gpu") == wanted


def test_server_bundles_are_pinned_to_their_nodes():
    pp = ServerPlan("server PP=2", Shape(pp=2), ("10.0.0.1", "10.0.0.2"))
    assert pp.wanted("gpu", 1) == [{"GPU": 1.0, "CPU": 1.0, "node:10.0.0.1": doctor.PIN},
                                   {"GPU": 1.0, "node:10.0.0.2": doctor.PIN}]
    assert ServerPlan("server TP=1 (CPU)").wanted("cpu", 2) == [{"CPU": 2.0}]


def outcome(**changes) -> TrialOutcome:
    return TrialOutcome(started_at=datetime.now(UTC), argv=(), node_ip="10.0.0.1",
                        placement=("10.0.0.1", "10.0.0.2"), startup_s=41.4, **changes)


def record(i: int, error: str = "") -> RequestRecord:
    return RequestRecord(index=i, send_s=0.0, ttft_s=None, chunk_s=(), end_s=None,
                         prompt_tokens=1, output_tokens=0, success=not error, error=error)


def test_server_rows():
    plan, log = ServerPlan("server PP=2", Shape(pp=2)), Path("/r/doctor/server-PP=2.log")
    ok = doctor.server_check(plan, outcome(metrics={"completed": 20, "output_throughput": 812.4}),
                             20, log)
    assert ok == Check("10.0.0.1, 10.0.0.2", "server PP=2", OK,
                       "20/20 requests ok, ready in 41 s, 812 output tok/s")
    short = doctor.server_check(plan, outcome(
        metrics={"completed": 19, "output_throughput": 700.0},
        steps=(LoadStep(None, 0.0, (record(0), record(1, "HTTP 500"))),)), 20, log)
    assert short.result == FAIL
    assert "19/20 requests ok" in short.detail and "HTTP 500" in short.detail
    failed = doctor.server_check(plan, outcome(fail_reason="oom_at_startup",
                                               fail_detail="CUDA out of memory"), 20, log)
    assert failed == Check("10.0.0.1, 10.0.0.2", "server PP=2", FAIL,
                           f"oom_at_startup: CUDA out of memory (log: {log})")


def test_doctor_plan_is_the_sweeps_load_cut_to_20_requests_without_warmup(tiny_model):
    from framework.config.specs import load_sweep
    from framework.sweep.trial_load import load_plan

    plan = doctor.doctor_plan(load_plan(load_sweep(ROOT / "sweeps" / "quickstart.yaml")))
    assert len(plan.measured) == 20 and list(plan.warmup) == [] and plan.capacity is None
    assert plan.max_concurrency == 32 and plan.sla_guard is None
    assert list(plan.repeat_requests) == []


def test_table_has_one_row_per_check():
    rows = [Check("driver", "results dir", OK, "/r writable"),
            Check("10.0.0.1", "GPUs", FAIL, "bundles [{'GPU': 1.0}] cannot be placed")]
    console = Console(record=True, width=200, file=io.StringIO())
    console.print(doctor.table(rows))
    text = console.export_text()
    assert "bundles [{'GPU': 1.0}] cannot be placed" in text  # no rich markup in details
    assert table_rows(text) == [
        ["driver", "results dir", "ok", "/r writable"],
        ["10.0.0.1", "GPUs", "FAIL", "bundles [{'GPU': 1.0}] cannot be placed"]]


class NoLauncher:
    def launch(self, *args, **kwargs):
        raise AssertionError("no server may start when a node check failed")


def test_run_starts_no_server_when_a_node_check_failed(tiny_model, tmp_path, monkeypatch):
    from framework.sweep import loader as sweep_mod

    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("VLLM_SWEEP_CACHE_DIR", raising=False)
    sw = sweep_mod.load(ROOT / "sweeps" / "quickstart.yaml", check_flags=False)
    sw = sweep_mod.Sweep(sw.path, sw.spec.model_copy(update={"results_dir": tmp_path / "r"}),
                         sw.space, sw.facts)
    seen = []

    def probe(cache: str, host: str) -> list[NodeReport]:
        seen.append((cache, host))
        return [node("127.0.0.1", cache_error="not writable: Not a directory")]

    rows = doctor.run(sw, True, "127.0.0.1", NoLauncher(), probe, lambda _: None)
    assert seen == [(str(ROOT / ".cache"), "127.0.0.1")]
    assert rows[0] == Check("driver", "results dir", OK, f"{tmp_path / 'r'} writable")
    assert Check("all nodes", "server TP=1 (CPU)", SKIPPED,
                 "not started: the checks above failed") in rows
    assert doctor.exit_code(rows, 3) == 3


def test_probe_node_on_this_machine_expands_home(tmp_path, monkeypatch):
    from framework.cluster.node_probe import probe_node

    monkeypatch.setenv("HOME", str(tmp_path))
    report = probe_node("127.0.0.1", "~/.cache/vllm-sweep", "127.0.0.1")
    assert report.cache_dir == str(tmp_path / ".cache" / "vllm-sweep") and report.cache_error == ""
    assert report.free_ports == node_report.MIN_FREE_PORTS
    assert report.versions["vllm"].startswith("0.") and report.versions["ray"] == "2.60.0"
    assert doctor.gpu_check(report, "cpu").result == OK
