"""A sweep as a Ray job (framework/sweep/job_dir.py): the job's working dir read from the
variable Ray's job supervisor sets, where results land, and a relative results_dir or a missing
relative model refused in Ray's uploaded copy of --working-dir (also through the CLI)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from framework.base.errors import ConfigError
from framework.config.specs import SweepSpec
from framework.sweep.job_dir import JOB_CONFIG_VAR
from framework.sweep.job_dir import check_job_paths
from framework.sweep.job_dir import in_place_working_dir
from framework.sweep.job_dir import in_uploaded_copy
from framework.sweep.job_dir import job_working_dir
from framework.sweep.job_dir import results_place
from tests.paths import CLI
from tests.paths import ROOT


def job_env(working_dir: str | None) -> dict[str, str]:
    """The entrypoint's variable as job_supervisor._get_driver_env_vars writes it."""
    runtime_env = {} if working_dir is None else {"working_dir": working_dir}
    return {JOB_CONFIG_VAR: json.dumps({"runtime_env": runtime_env,
                                        "metadata": {"job_submission_id": "raysubmit_x"}})}


UPLOADED = "gcs://_ray_pkg_0123456789abcdef.zip"


@pytest.mark.parametrize(("env", "uri", "uploaded"), [
    ({}, None, False),                                      # not a Ray job
    (job_env(None), None, False),                           # a job without a working dir
    (job_env(UPLOADED), UPLOADED, True),                    # `--working-dir .`: uploaded copy
    (job_env("local:///srv/sweeps"), "local:///srv/sweeps", False),  # in place
    ({JOB_CONFIG_VAR: "not json"}, None, False),
    ({JOB_CONFIG_VAR: '{"runtime_env": null}'}, None, False),
])
def test_job_working_dir(env, uri, uploaded):
    assert job_working_dir(env) == uri
    assert in_uploaded_copy(env) is uploaded


@pytest.mark.parametrize(("results_dir", "cwd", "expected"), [
    ("results", "/home/u/repo", "/home/u/repo/results/qs"),       # relative: from cwd
    ("./out/../results", "/home/u/repo", "/home/u/repo/results/qs"),  # normalized
    ("/mnt/shared/r", "/home/u/repo", "/mnt/shared/r/qs"),        # absolute: as given
    ("../r", "/home/u/repo", "/home/u/r/qs"),
])
def test_results_place(results_dir, cwd, expected):
    assert results_place(Path(results_dir), "qs", Path(cwd)) == Path(expected)


def test_in_place_working_dir_is_an_absolute_local_uri(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert in_place_working_dir(Path(".")) == f"local://{tmp_path}"


def spec(model: str, results_dir: str) -> SweepSpec:
    return SweepSpec(name="t", model=model, search_space="s.yaml", results_dir=results_dir)


@pytest.mark.parametrize(("model", "results_dir", "env", "key"), [
    ("models/m", "results", job_env(UPLOADED), "results_dir"),   # would vanish with the job
    ("models/m", "/abs/results", job_env(UPLOADED), "model"),    # upload left models/ out
    ("/abs/m", "/abs/results", job_env(UPLOADED), None),         # absolute: the nodes' business
    ("models/m", "results", job_env("local:///srv/repo"), None),  # in place: like a local run
    ("models/m", "results", {}, None),                           # not a job
])
def test_check_job_paths(tmp_path, monkeypatch, model, results_dir, env, key):
    monkeypatch.chdir(tmp_path)  # no models/m here, as in an upload without git-ignored folders
    if key is None:
        check_job_paths(Path("s.yaml"), spec(model, results_dir), env)
        return
    with pytest.raises(ConfigError) as err:
        check_job_paths(Path("s.yaml"), spec(model, results_dir), env)
    assert err.value.key == key
    assert "vllm-sweep submit" in err.value.reason


def test_cli_refuses_a_relative_results_dir_in_an_uploaded_job_copy(tmp_path):
    """The issue's command, as the job's entrypoint sees it: a copy of the repository's sweep
    files without models/, the job variable of an uploaded working dir. One line, exit 2."""
    for folder in ("sweeps", "search_spaces"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    env = {**job_env(UPLOADED), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([*CLI, "status", "sweeps/quickstart.yaml"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "results_dir: 'results': relative" in lines[0], out.stderr
    assert not (tmp_path / "results").exists()
