"""`results_dir` as a folder or an object store URI, and `search.storage` as a database URL:
what the sweep file may say, and the one-line error (file, key, value) for what it may not."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from framework.base.errors import ConfigError
from framework.config.results_location import uri_problem
from framework.config.specs import load_sweep
from framework.results.object_store import join_uri


def sweep_file(tmp_path: Path, **extra) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "model": "m", "search_space": "sp.yaml", **extra}))
    return path


@pytest.mark.parametrize(("given", "expected"), [
    ("results", Path("results")),                       # a folder, relative to where it runs
    ("/data/results", Path("/data/results")),
    ("s3://team-bucket/sweeps", "s3://team-bucket/sweeps"),  # stays a URI: // is kept
    ("gs://team-bucket/sweeps", "gs://team-bucket/sweeps"),
    ("s3://b/p?endpoint_override=127.0.0.1:9000&scheme=http",
     "s3://b/p?endpoint_override=127.0.0.1:9000&scheme=http"),
])
def test_results_dir_is_a_folder_or_a_uri(tmp_path, given, expected):
    spec = load_sweep(sweep_file(tmp_path, results_dir=given))
    assert spec.results_dir == expected and type(spec.results_dir) is type(expected)


@pytest.mark.parametrize(("given", "why"), [
    ("ftp://host/results", "scheme 'ftp' is not supported; use one of s3, gs, gcs"),
    ("s3://", "names no bucket"),
])
def test_an_unusable_uri_is_one_line_naming_the_key(tmp_path, given, why):
    path = sweep_file(tmp_path, results_dir=given)
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert str(path) in str(err.value) and "results_dir" in str(err.value) and why in str(err.value)
    assert uri_problem(given) == why


@pytest.mark.parametrize(("uri", "parts", "expected"), [
    ("s3://b/p", ("s", "logs/trial-00001.log"), "s3://b/p/s/logs/trial-00001.log"),
    ("s3://b/p/", ("s",), "s3://b/p/s"),
    ("s3://b?endpoint_override=h:1", ("s",), "s3://b/s?endpoint_override=h:1"),
])
def test_join_uri_keeps_the_query_last(uri, parts, expected):
    assert join_uri(uri, *parts) == expected


@pytest.mark.parametrize(("url", "problem"), [
    ("postgresql://optuna@127.0.0.1:5432/studies", None),
    ("postgresql+psycopg://optuna@/studies?host=/run/postgresql", None),
    ("sqlite:////data/study.db", None),
    ("postgresql://optuna:hunter2@db/studies", "a password in a sweep file is a secret"),
    ("redis://127.0.0.1:6379", "not a database URL"),
])
def test_search_storage_is_a_database_url_without_a_password(tmp_path, url, problem):
    path = sweep_file(tmp_path, search={"storage": url})
    if problem is None:
        assert load_sweep(path).search.storage == url
        return
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert "search.storage" in str(err.value) and problem in str(err.value)
    assert "hunter2" not in str(err.value)  # the secret is not repeated
