"""A sweep run as a Ray job: where its relative paths land, and what `submit` runs.

Ray starts a job's driver, and every task and actor of the job, in the job's working dir
(ray/_private/runtime_env/working_dir.py, `WorkingDirPlugin.modify_context`: `cd DIR &&`).
With `--working-dir DIR` that is an unpacked copy of DIR in Ray's temp dir, uploaded without
the files DIR's `.gitignore` lists (ray/_private/runtime_env/packaging.py, `_dir_travel` and
`get_excludes_from_ignore_files`; a `.rayignore` adds exclusions, it cannot re-include) and
deleted with the job's session; the driver learns nothing of DIR's place on the submitting side
(its runtime_env holds only the package's `gcs://` URI). With `--working-dir local://DIR` Ray
uploads nothing and runs the job in DIR itself, which must exist on every node (Ray 2.60's
in-place working dir: `get_local_dir_uri_path`, `raise_if_local_dir_uri_missing`).

`vllm-sweep submit` therefore submits `vllm-sweep run SWEEP` with `local://<cwd>`: relative
paths resolve as they do for a local `vllm-sweep run`, on every node. A sweep run in an
uploaded copy refuses a relative results_dir (it would vanish with Ray's temp dir; an object
store URI is fine) and says why a relative model is missing, except the project's tiny model
(tools.tiny_model.TINY_MODEL_DIR), which the driver's node and every server's node build in
their copy (seeded: the same files; cluster.actors does it on a server's node).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from framework.base.errors import ConfigError
from framework.config.specs import SweepSpec
from framework.tools.tiny_model import ensure_tiny_model

# Set by Ray's job supervisor for the entrypoint only: {"runtime_env": ..., "metadata": ...}
# (ray/dashboard/modules/job/job_supervisor.py, `_get_driver_env_vars`; the name is
# ray/_private/runtime_env/constants.py's RAY_JOB_CONFIG_JSON_ENV_VAR).
JOB_CONFIG_VAR = "RAY_JOB_CONFIG_JSON_ENV_VAR"
LOCAL_SCHEME = "local://"
SUBMIT_HINT = ("submit with `vllm-sweep submit SWEEP` (the job runs in place, "
               "`--working-dir local://$PWD`), or give an absolute path every node can read")


def job_working_dir(env: Mapping[str, str]) -> str | None:
    """The working_dir URI of the Ray job this process is the entrypoint of; None outside a
    job, or for a job without a working dir."""
    raw = env.get(JOB_CONFIG_VAR)
    if not raw:
        return None
    try:
        runtime_env = json.loads(raw).get("runtime_env") or {}
    except (ValueError, AttributeError):
        return None
    working_dir = runtime_env.get("working_dir") if isinstance(runtime_env, dict) else None
    return str(working_dir) if working_dir else None


def in_uploaded_copy(env: Mapping[str, str]) -> bool:
    """True when this process is a Ray job's entrypoint running in an uploaded (temporary)
    copy of its working dir, not in place (`local://`)."""
    uri = job_working_dir(env)
    return uri is not None and not uri.startswith(LOCAL_SCHEME)


def in_place_working_dir(cwd: Path) -> str:
    """Ray's in-place working dir for `cwd`: `local://` + its absolute path."""
    return LOCAL_SCHEME + os.path.abspath(cwd)


def results_place(results_dir: Path, name: str, cwd: Path) -> Path:
    """Where a sweep's results go (results.store): `results_dir/name`, a relative results_dir
    taken from `cwd` (normalized lexically: `..` folded, symlinks not followed)."""
    return Path(os.path.normpath(cwd / results_dir / name))


def check_job_paths(path: Path, spec: SweepSpec, env: Mapping[str, str]) -> None:
    """In an uploaded job copy: a relative results_dir is an error (the results would be
    deleted with Ray's temp dir), and so is a relative model folder the upload left out,
    with the reason. Elsewhere nothing is checked here."""
    if not in_uploaded_copy(env):
        return
    if isinstance(spec.results_dir, Path) and not spec.results_dir.is_absolute():
        raise ConfigError(str(path), "results_dir", str(spec.results_dir),
                          "relative, and this Ray job runs in Ray's temporary copy of "
                          f"--working-dir ({os.getcwd()}), deleted with the job: {SUBMIT_HINT}")
    if ensure_tiny_model(spec.model):  # the quickstart's model: every node builds its own
        print(f"built the project's tiny model at {spec.model} in Ray's copy of --working-dir "
              "(models/ is git-ignored, so not uploaded); each node builds the same", flush=True)
    if not spec.model.is_absolute() and not (spec.model / "config.json").is_file():
        raise ConfigError(str(path), "model", str(spec.model),
                          "no config.json in Ray's uploaded copy of --working-dir, which "
                          f"leaves out what .gitignore lists (models/ is): {SUBMIT_HINT}")
