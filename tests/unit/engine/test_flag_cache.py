"""The vLLM parser's answers kept per vLLM version (framework.engine.flag_cache): the same
answers from the cache as from vLLM, a warm cache checks a sweep without importing vLLM, and
what names a file or is unreadable is asked again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from framework.engine import flag_cache
from framework.engine.flag_check import args_problem
from framework.engine.flag_check import installed_vllm_flags
from framework.engine.flag_check import parsed_number
from framework.engine.flag_check import value_problem
from tests.paths import ROOT


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(flag_cache.CACHE_DIR_VAR, str(tmp_path))
    return tmp_path


def _entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("vllm-flags/*/*.json"))


def test_answers_from_the_cache_equal_vllms(cache):
    questions = [
        lambda: value_problem("max-num-seqs", 0),
        lambda: value_problem("max-num-seqs", 8),
        lambda: value_problem("enable-prefix-caching", "yes"),
        lambda: value_problem("gpu-memory-utilization", 1.5),
        lambda: parsed_number("max-model-len", "1k"),
        lambda: parsed_number("kv-cache-dtype", "fp8"),
        lambda: args_problem({"enable-auto-tool-choice": True}),
        lambda: sorted(installed_vllm_flags() or ()),
    ]
    first = [q() for q in questions]
    assert first[0] and not first[1] and first[2] and first[3]
    assert first[4] == (True, 1000) and first[5] == (False, None)
    assert first[6] and "max-num-seqs" in first[7]
    assert len(_entries(cache)) == len(questions)
    assert [q() for q in questions] == first  # now from the cache


def test_unreadable_entry_is_asked_again(cache):
    answer = value_problem("max-num-seqs", 0)
    (entry,) = _entries(cache)
    entry.write_text("{not json")
    assert value_problem("max-num-seqs", 0) == answer
    assert json.loads(entry.read_text())["value"] == answer


def test_values_naming_files_are_never_cached(cache, tmp_path):
    template = tmp_path / "template.jinja"
    template.write_text("{{ messages }}")
    args_problem({"chat-template": str(template)})
    value_problem("chat-template", str(template))
    assert _entries(cache) == []


def test_no_cache_dir_no_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(flag_cache.CACHE_DIR_VAR, raising=False)
    monkeypatch.chdir(tmp_path)
    assert value_problem("max-num-seqs", 0)
    assert not list(tmp_path.rglob("*.json"))


def test_a_warm_cache_checks_the_quickstart_without_vllm(cache):
    child = ("import sys; from pathlib import Path; from framework.sweep import loader; "
             "loader.load(Path('sweeps/quickstart.yaml')); print('vllm' in sys.modules)")
    env = {**os.environ, flag_cache.CACHE_DIR_VAR: str(cache)}
    runs = [subprocess.run([sys.executable, "-c", child], cwd=ROOT, env=env, text=True,
                           capture_output=True, timeout=300) for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[-1].stderr[-2000:]
    assert [r.stdout.strip() for r in runs] == ["True", "False"]
