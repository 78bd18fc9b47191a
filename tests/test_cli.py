"""The command line as a user meets it: exit codes and one-line errors, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


def vllm_sweep(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "framework.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_validate_accepts_the_quickstart(tiny_model):
    res = vllm_sweep("validate", "sweeps/quickstart.yaml")
    assert res.returncode == 0, res.stderr
    assert "ok" in res.stdout


@pytest.mark.parametrize("text, key", [
    ("name: x\nmodel: models/tiny-llama\nsearch_space: search_spaces/tiny_cpu.yaml\nworkload: {num_prompts: -3}\n",
     "workload.num_prompts"),
    ("name: x\nmodel: models/tiny-llama\nsearch_space: nowhere.yaml\n", "search_space"),
    ("name: x\nmodel: /no/such/model\nsearch_space: search_spaces/tiny_cpu.yaml\n", "model"),
    ("name: x\nmodel: [unclosed\n", "line"),
    ("name: x\nname: y\nmodel: models/tiny-llama\nsearch_space: search_spaces/tiny_cpu.yaml\n",
     "line 2"),
    ("name: x\nmodel: models/tiny-llama\nsearch_space: search_spaces/tiny_cpu.yaml\n"
     "server: {args: {num-scheduler-steps: 8}}\n", "server.args.num-scheduler-steps"),
    ("name: x\nmodel: models/tiny-llama\nsearch_space: search_spaces/tiny_cpu.yaml\n"
     "server: {args: {no-such-vllm-flag: 1}}\n", "server.args.no-such-vllm-flag"),
    ("name: x\nmodel: models/tiny-llama\nsearch_space: search_spaces/tiny_cpu.yaml\n"
     "server: {args: {tensor-parallel-size: 3}}\n", "server.args.tensor-parallel-size"),
])
def test_bad_input_is_one_line_exit_2_no_traceback(tmp_path, tiny_model, text, key):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    for command in ("validate", "run"):
        res = vllm_sweep(command, str(bad))
        assert res.returncode == 2, (command, res.stdout, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1, res.stderr
        assert str(bad) in lines[0] and key in lines[0]
        assert "Traceback" not in res.stderr + res.stdout
    assert not (ROOT / "results" / "x").exists()


def test_bad_input_leaves_existing_results_untouched(tmp_path, tiny_model):
    results = tmp_path / "results" / "x"
    (results / "trials" / "sweep=x").mkdir(parents=True)
    kept = results / "trials" / "sweep=x" / "trial-00000.parquet"
    kept.write_bytes(b"PAR1 stand-in bytes")
    space = tmp_path / "space.yaml"
    space.write_text("parameters:\n  tensor-parallel-size: {type: categorical, choices: [1, 3]}\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"name: x\nmodel: {tiny_model}\nsearch_space: {space}\n"
                   f"results_dir: {tmp_path / 'results'}\nsearch: {{baseline: false}}\n")
    before = sorted((p.name, p.stat().st_mtime_ns) for p in results.rglob("*"))
    res = vllm_sweep("run", str(bad))
    assert res.returncode == 2, res.stderr
    assert "parameters.tensor-parallel-size" in res.stderr and "3" in res.stderr
    assert sorted((p.name, p.stat().st_mtime_ns) for p in results.rglob("*")) == before
