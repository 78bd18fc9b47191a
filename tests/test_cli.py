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
