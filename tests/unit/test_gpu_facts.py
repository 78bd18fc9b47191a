"""tests/gpu/gpu_facts.py without a GPU: its refusal, the memory-model names it reads, and how it
judges what its measuring processes answer (canned answers in place of a GPU's)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from framework.engine import memory_model
from tests.gpu import gpu_facts
from tests.paths import ROOT

GIB = 2**30
MIB = 2**20


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_refuses_in_one_line_without_a_gpu(extra):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU even where the machine has one
    p = subprocess.run([sys.executable, "tests/gpu/gpu_facts.py", *extra], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("gpu_facts: refused, no CUDA GPU")
    assert "run it on a node with an NVIDIA GPU" in lines[0]


def test_the_memory_model_names_it_reads_exist():
    for name in gpu_facts.MODEL_CONSTANTS:
        assert hasattr(memory_model, name), name
    assert gpu_facts.model_constants() == {n: getattr(memory_model, n)
                                           for n in gpu_facts.MODEL_CONSTANTS}
    assert 0 < memory_model.CUDA_CONTEXT_BYTES < 2 * GIB
    assert 0 < memory_model.NON_TORCH_BYTES_TP1 < 2 * GIB
    gpus = memory_model.GPUS
    # torch's device names (get_device_properties().name) -> the table's entries
    for torch_name, gib, entry in (("NVIDIA H100 80GB HBM3", 79.1, "H100-80GB"),
                                   ("NVIDIA H200", 139.8, "H200-141GB"),
                                   ("NVIDIA A100-SXM4-80GB", 79.2, "A100-80GB"),
                                   ("NVIDIA A100-SXM4-40GB", 39.4, "A100-40GB"),
                                   ("NVIDIA L40S", 44.5, "L40S-48GB"),
                                   ("NVIDIA L4", 22.0, "L4-24GB")):
        assert gpu_facts.table_entry(gpus, torch_name, int(gib * GIB))[0] == entry
    assert gpu_facts.table_entry(gpus, "NVIDIA B200", 178 * GIB) is None


def test_every_check_names_the_project_file_that_relies_on_it():
    for relied in gpu_facts.RELIES.values():
        path = relied.split()[0]
        assert (ROOT / path).is_file(), path


def test_a_killed_unreaped_child_reads_as_a_zombie():
    """The release check's method on any machine: a SIGKILLed child it has not waited for."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(p.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while gpu_facts.proc_state(p.pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gpu_facts.proc_state(p.pid) == "Z"
    finally:
        p.wait()
    assert gpu_facts.proc_state(p.pid) == "gone"


def _child(ok: bool, **more):
    base = {"ok": ok, "driver": {"cuInit": 0 if ok else 3, "count": 1}}
    return {**base, **more}


FORKS_AS_ASSUMED = {
    "nvml_only": {"parent_cuinit": False, "device_count": 2, "child": _child(True)},
    "is_available": {"parent_cuinit": True, "child": _child(False, error="RuntimeError: Cannot "
                                                              "re-initialize CUDA in forked "
                                                              "subprocess")},
    "device_query": {"parent_cuinit": True, "child": _child(False, error="RuntimeError: x")},
    "cvd": {"parent_cuinit": False, "target_index": 1, "uuids": ["GPU-a", "GPU-b"],
            "child_target": _child(True, count=1, uuid="GPU-b", cvd="1"),
            "child_absent": _child(False, count=0, cvd="99")},
}


def test_fork_checks_pass_when_the_forks_behave_as_the_project_assumes(monkeypatch):
    monkeypatch.setattr(gpu_facts, "run_fork_parent", lambda mode, budget: FORKS_AS_ASSUMED[mode])
    checks = gpu_facts.fork_checks(gpu_facts.Budget(60))
    assert [(c.name, c.ok) for c in checks] == [
        ("fork_nvml_only", True), ("fork_is_available", True), ("fork_device_query", True),
        ("fork_cvd", True)]
    for c in checks:
        line = c.line()
        assert "\n" not in line and line.startswith("PASS ") and "relied on by: framework/" in line


def test_fork_checks_fail_on_what_would_break_the_project(monkeypatch):
    answers = {
        # NVML unavailable: device_count fell back to cudaGetDeviceCount, the fork is broken
        "nvml_only": {"parent_cuinit": True, "child": _child(False, error="RuntimeError: x")},
        # is_available no longer initialises CUDA (harmless, but the premise changed)
        "is_available": {"parent_cuinit": False, "child": _child(True)},
        "device_query": {"error": "timed out after 120 s"},
        # the fork computes on another GPU than the one it named
        "cvd": {**FORKS_AS_ASSUMED["cvd"],
                "child_target": _child(True, count=2, uuid="GPU-a", cvd="1")},
    }
    monkeypatch.setattr(gpu_facts, "run_fork_parent", lambda mode, budget: answers[mode])
    checks = gpu_facts.fork_checks(gpu_facts.Budget(60))
    assert [c.ok for c in checks] == [False] * 4
    assert checks[0].line().startswith("FAIL fork_nvml_only: parent cuInit: yes")
    assert "timed out" in checks[2].measured


class _FakeObserver:
    def __init__(self, frees):
        self.frees = iter(frees)

    def free(self, device, timeout_s=60.0):
        return next(self.frees)

    def end(self):
        pass


class _FakeProbe:
    def __init__(self, steps):
        self.lines = iter(json.dumps(s) for s in steps)

    def readline(self, timeout_s):
        return next(self.lines, None)

    def send(self, text):
        pass

    def end(self):
        pass

    def stderr_tail(self):
        return "Traceback: died"


def _probe(monkeypatch, context, non_torch, workspace, name="NVIDIA H100 80GB HBM3",
           total=int(79.11 * GIB), steps=5):
    f0 = 70 * GIB
    a = 32 * MIB
    frees = [f0, f0, f0 - context - 2 * MIB, f0 - context - 2 * MIB - a,
             f0 - context - 2 * MIB - 2 * a - workspace - non_torch, f0]
    answers = [{"step": "imported"},
               {"step": "context", "reserved": 2 * MIB, "name": name, "uuid": "GPU-a",
                "total": total, "module_loading": "LAZY"},
               {"step": "tensors", "reserved": 2 * MIB + a},
               {"step": "gemm", "reserved": 2 * MIB + 2 * a + workspace},
               {"step": "workspace", "reserved_with": workspace, "reserved_without": 0,
                "cleared": True}][:steps]
    monkeypatch.setattr(gpu_facts, "Observer", lambda env: _FakeObserver(frees))
    monkeypatch.setattr(gpu_facts, "Proc", lambda args, env: _FakeProbe(answers))
    checks = gpu_facts.probe_checks(0, "0", gpu_facts.model_constants(), gpu_facts.Budget(60))
    return {c.name: c for c in checks}


def test_context_cublas_and_table_against_the_memory_model(monkeypatch):
    checks = _probe(monkeypatch, context=int(0.50 * GIB), non_torch=60 * MIB, workspace=32 * MIB)
    assert {n: c.ok for n, c in checks.items()} == {
        "context[cuda:0]": True, "cublas[cuda:0]": True, "gpu_table[cuda:0]": True}
    assert checks["context[cuda:0]"].values["context_bytes"] == int(0.50 * GIB)
    assert checks["cublas[cuda:0]"].values["gemm_non_torch_bytes"] == 60 * MIB
    assert checks["cublas[cuda:0]"].values["cublas_workspace_bytes"] == 32 * MIB
    assert "CUDA_CONTEXT_BYTES 0.510 GiB" in checks["context[cuda:0]"].measured

    checks = _probe(monkeypatch, context=int(0.80 * GIB), non_torch=300 * MIB, workspace=32 * MIB,
                    name="NVIDIA H100 NVL", total=int(93.1 * GIB))
    assert not any(c.ok for c in checks.values())


def test_a_probe_that_dies_fails_its_checks_as_not_measured(monkeypatch):
    checks = _probe(monkeypatch, context=int(0.5 * GIB), non_torch=0, workspace=0, steps=1)
    assert not any(c.ok for c in checks.values())
    assert all("not measured" in c.measured and "died" in c.measured for c in checks.values())


def test_a_probe_step_line_carries_the_device_name(monkeypatch, capsys):
    """The probe's context step reports the device's `name` beside the step's: a keyword that
    once collided with _step's own parameter (the probe died on the first GPU run, session 18)."""
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO("go\n"))
    gpu_facts._step("context", name="NVIDIA H200", reserved=2 * MIB)
    line = json.loads(capsys.readouterr().out)
    assert line == {"step": "context", "name": "NVIDIA H200", "reserved": 2 * MIB}


def test_a_role_that_dies_is_reported_with_its_exit_and_last_stderr_line():
    code = "import sys; print('first', flush=True); sys.stdout.close(); sys.exit('boom: died')"
    proc = gpu_facts.Proc.__new__(gpu_facts.Proc)  # its reader, over a process that dies
    proc._buf = b""
    proc.popen = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    try:
        assert proc.readline(60) == "first"
        assert proc.readline(60) is None  # EOF
        assert proc.stderr_tail() == "exit 1: boom: died"
    finally:
        proc.end()
