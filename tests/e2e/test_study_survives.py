"""Issue #35 item 2, end to end: a sweep whose driver is killed -9 resumes on another machine with
no trial lost and none duplicated, when its results are in an S3 bucket (a real S3 API server on
loopback, tests/storage_servers.py; the Optuna journal mirrored there) or its study in PostgreSQL
(`search.storage`, Optuna's RDBStorage; a real server in a temp folder). "Another machine": the
killed driver's staging copy is deleted before the resume, so all the resumed driver has is what
the bucket or the database holds.

FakeEngine sweeps (a named fake: the vLLM HTTP contract, tests/unit/engine/test_fake_engine.py) on
the session's shared Ray: a grid of three configurations, one at a time, the second held while it
starts (a start-up pass, fake_engine.py) so that the kill lands while it has no row, after the
first trial's row is stored, whatever the machine's speed.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import duckdb
import optuna
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pytest
import yaml
from optuna.trial import TrialState

from framework.results.object_store import STAGING_PREFIX
from tests.cli import cli_in_process
from tests.cli import end_driver
from tests.cli import joined_cli_env
from tests.cli import kill_driver
from tests.cli import read_until
from tests.cli import run_joined
from tests.cli import start_driver
from tests.clusters import SharedRay
from tests.clusters import join_shared
from tests.procs import wait_no_trial_processes
from tests.storage_servers import BUCKET
from tests.storage_servers import S3
from tests.storage_servers import Postgres
from tests.storage_servers import create_database
from tests.storage_servers import postgres_server
from tests.storage_servers import s3_server
from tests.sweeps import NO_REMEASURE
from tests.sweeps import read_trials

pytestmark = pytest.mark.server
PROMPTS = 12
SEQS = [4, 8, 16]


@pytest.fixture(scope="module")
def s3() -> Iterator[S3]:
    with s3_server() as server:
        yield server


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    with postgres_server() as server:
        yield server


def grid_sweep(ray: SharedRay, tmp: Path, model: Path, name: str, results_dir: str,
               search: dict) -> Path:
    """Three FakeEngine trials (max-num-seqs 4, 8, 16), one at a time; a server finishes
    starting only by taking a file from tmp/passes; a trial cut by the kill runs again."""
    passes = tmp / "passes"
    passes.mkdir()
    space = tmp / "space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        "max-num-seqs": {"type": "categorical", "choices": SEQS, "default": 16}}}))
    sweep = tmp / f"{name}.yaml"
    sweep.write_text(yaml.safe_dump(join_shared({
        "name": name, "model": str(model), "search_space": str(space), "engine": "fake",
        "server": {"reuse": False, "env": {"FAKE_ENGINE_STARTUP_S": "0.2",
                                           "FAKE_ENGINE_STARTUP_PASSES": str(passes)}},
        "workload": {"num_prompts": PROMPTS, "input_len": 16, "output_len": 4,
                     "warmup_requests": 0},
        "search": {**NO_REMEASURE, "sampler": "grid", "n_trials": 3, "baseline": False,
                   "requeue_interrupted": True, **search},
        "results_dir": results_dir}, ray)))
    return sweep


def give_passes(folder: Path, count: int) -> None:
    for _ in range(count):
        (folder / os.urandom(8).hex()).touch()


def kill_after_first_row(sweep: Path, tmp: Path, env: dict[str, str], row_stored) -> None:
    """Run the sweep as a child driver; kill -9 it once trial 1's server is starting (held)
    and trial 0's row is stored (`row_stored()`); then drop its staging copies (another
    machine resumes)."""
    give_passes(tmp / "passes", 1)  # trial 0's server starts; trial 1's waits for a pass
    proc = start_driver(sweep, tmp, env)
    try:
        seen = read_until(proc, "trial 1: starting server", timeout_s=120)
        assert "trial 1: starting server" in seen, seen
        if "so far" not in seen:  # trial 0's result line: after its row and its tell
            seen += read_until(proc, "so far", timeout_s=120)
        assert "so far" in seen and row_stored(), seen
        kill_driver(proc)
    finally:
        end_driver(proc)
    for staging in tmp.glob(STAGING_PREFIX + "*"):
        shutil.rmtree(staging)


def check_nothing_lost_or_doubled(trials, study: optuna.Study) -> None:
    """Every configuration measured exactly once; each interrupted trial ran again later; the
    rows and the study hold the same trials, in the same states."""
    complete = trials[trials["state"] == "COMPLETE"]
    assert sorted(complete["param_max_num_seqs"]) == SEQS, trials[["trial_number", "state"]]
    assert trials["trial_number"].is_unique
    assert (complete["completed"] == PROMPTS).all()
    for _, row in trials[trials["fail_reason"] == "interrupted"].iterrows():
        later = complete[(complete["param_max_num_seqs"] == row["param_max_num_seqs"])
                         & (complete["trial_number"] > row["trial_number"])]
        assert len(later) == 1, trials[["trial_number", "state", "param_max_num_seqs"]]
    finished = {t.number: t.state for t in study.get_trials(deepcopy=False)
                if t.state in (TrialState.COMPLETE, TrialState.FAIL)}
    assert set(finished) == set(trials["trial_number"]), (finished, list(trials["trial_number"]))
    for _, row in trials.iterrows():
        assert finished[row["trial_number"]].name == row["state"], row


@pytest.mark.timeout(300)
def test_results_in_a_bucket_resume_after_kill_9_on_a_machine_without_them(
        shared_ray, tiny_model, short_tmp, s3):
    location = f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}/results"
    sweep = grid_sweep(shared_ray, short_tmp, tiny_model, "bucket", location, {})
    env = {**joined_cli_env(shared_ray.marker, short_tmp, shared_ray.folder), **s3.env}
    fs, prefix = s3.filesystem(), location.removeprefix("s3://") + "/bucket"

    def row_stored() -> bool:
        info = fs.get_file_info(f"{prefix}/trials/sweep=bucket/trial-00000.parquet")
        return info.type == pafs.FileType.File

    kill_after_first_row(sweep, short_tmp, env, row_stored)
    give_passes(short_tmp / "passes", 10)
    again = run_joined(shared_ray, ["run", str(sweep)], short_tmp, env=s3.env)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"results: {location}/bucket" in again.stdout

    # the bucket, read as an analyst would: DuckDB over pyarrow datasets of the S3 objects
    trials_data = ds.dataset(f"{prefix}/trials", filesystem=fs, partitioning="hive")  # noqa: F841
    requests_data = ds.dataset(f"{prefix}/requests", filesystem=fs, partitioning="hive")  # noqa: F841
    trials = duckdb.sql("SELECT * FROM trials_data ORDER BY trial_number").df()
    per_trial = dict(duckdb.sql("SELECT trial_number, count(*) FILTER (WHERE success) "
                                "FROM requests_data GROUP BY trial_number").fetchall())
    for _, row in trials.iterrows():  # the requests reconcile with the rows
        assert per_trial.get(row["trial_number"], 0) == row["completed"], row
        assert row["server_log"].startswith(f"{location}/bucket/logs/"), row["server_log"]
    journal = short_tmp / "journal"
    journal.write_bytes(fs.open_input_stream(f"{prefix}/optuna.journal").read())
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(
        str(journal)))
    check_nothing_lost_or_doubled(trials, optuna.load_study(study_name="bucket", storage=storage))

    status = cli_in_process("status", str(sweep), cwd=short_tmp,
                            env={**joined_cli_env(shared_ray.marker, short_tmp), **s3.env})
    assert status.returncode == 0 and "3/3 trials finished" in status.stdout, status.stdout + status.stderr
    assert wait_no_trial_processes(shared_ray.marker) == []


@pytest.mark.timeout(300)
def test_a_study_in_postgresql_resumes_after_kill_9(shared_ray, tiny_model, short_tmp, postgres):
    url = create_database(postgres, f"s{uuid.uuid4().hex[:8]}")
    results = short_tmp / "results"
    sweep = grid_sweep(shared_ray, short_tmp, tiny_model, "pg", str(results), {"storage": url})
    env = joined_cli_env(shared_ray.marker, short_tmp, shared_ray.folder)
    first_row = results / "pg" / "trials" / "sweep=pg" / "trial-00000.parquet"
    kill_after_first_row(sweep, short_tmp, env, first_row.is_file)
    assert not (results / "pg" / "optuna.journal").exists()  # the study is in the database
    give_passes(short_tmp / "passes", 10)
    again = run_joined(shared_ray, ["run", str(sweep)], short_tmp)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    study = optuna.load_study(study_name="pg", storage=url)
    check_nothing_lost_or_doubled(read_trials(results, "pg"), study)
    assert wait_no_trial_processes(shared_ray.marker) == []
