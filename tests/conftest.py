"""Shared fixtures: the tiny model, a short temp dir, and a process check by env marker.

Server tests tag every process they start with a unique environment variable and look for it
afterwards with psutil: that finds the sweep's Ray and vLLM processes (and only those).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY_MODEL = ROOT / "models" / "tiny-llama"
CLI = [sys.executable, "-m", "framework.cli"]
MARKER_VAR = "VLLM_SWEEP_TEST_MARKER"


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    if not (TINY_MODEL / "config.json").is_file():
        pytest.fail(f"{TINY_MODEL} is missing: run `make model` (make test does it)")
    return TINY_MODEL


@pytest.fixture
def short_tmp():
    """A short temp dir (Ray's unix socket paths must stay under ~107 characters)."""
    path = Path(tempfile.mkdtemp(prefix="vst-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def marked_processes(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(MARKER_VAR) == marker:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def wait_no_marked_processes(marker: str, timeout_s: float = 45.0) -> list[str]:
    """Poll until no process carries the marker; returns descriptions of any left."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = marked_processes(marker)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(1)
    described = []
    for proc in left:
        try:
            described.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    return described


def cli_env(marker: str, tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({MARKER_VAR: marker, "TMPDIR": str(tmp), "RAY_AUTH_MODE": "disabled",
                "PYTHONUNBUFFERED": "1"})
    return env


def new_marker() -> str:
    return uuid.uuid4().hex


def run_cli(args: list[str], cwd: Path, env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout_s)
