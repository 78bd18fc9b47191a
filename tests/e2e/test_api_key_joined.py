"""A sweep joined to a cluster keys its servers (#33 item 5): with no server.api_key_env, its
FakeEngine server (which answers /v1 as vLLM does: 401 without `Authorization: Bearer <key>`)
refuses a request without the run's random key or with a wrong one, while the sweep's own load
carries the key and succeeds; the key is in no result file and not in the output.
`--no-api-key` leaves the next trial's server open, with one warning line.
The secret-grep (#33's acceptance): a planted HF token handed to the servers through
`server.secret_env` and the run's key appear in no artifact of the sweep: no byte of any file
under the results (Parquet, logs, study journal), of the HTML report or of any export (serve,
json, ray-serve, k8s), not in the output, and not in the runtime_env of any actor the run
started (the actor table `ray list actors --detail` shows).

The refusals are sent from inside the run, just before each load starts (the load generator's
entry, wrapped in this process: the sweep runs in-process on the session's shared Ray)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest
import yaml

from framework.trial import measure
from tests.cli import cli_in_process
from tests.cli import run_joined
from tests.clusters import actor_table
from tests.clusters import join_shared
from tests.sweeps import NO_REMEASURE
from tests.sweeps import read_trials

pytestmark = pytest.mark.server


def status_of(base_url: str, key: str | None) -> int:
    """The HTTP status of one short completion sent to `base_url` with `key` (None: no header)."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    body = json.dumps({"model": "m", "prompt": "hello", "max_tokens": 1, "stream": True})
    req = urllib.request.Request(f"{base_url}/v1/completions", data=body.encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.timeout(300)
def test_a_joined_sweep_keys_its_servers_and_never_shows_the_key(shared_ray, tiny_model,
                                                                  short_tmp, monkeypatch):
    seen: list[tuple[str | None, int, int]] = []  # (the load's key, no key, a wrong key)
    real = measure.run_load

    async def load_after_probing(base_url, model, requests, **kwargs):
        key = kwargs.get("api_key")
        bare = await asyncio.to_thread(status_of, base_url, None)
        wrong = await asyncio.to_thread(status_of, base_url, "not-the-key")
        seen.append((key, bare, wrong))
        return await real(base_url, model, requests, **kwargs)

    monkeypatch.setattr(measure, "run_load", load_after_probing)
    hf_token = "hf_plantedSecret0123456789abcdef"  # as a user's HF_TOKEN would be
    monkeypatch.setenv("HF_TOKEN", hf_token)
    space = short_tmp / "space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        "max-num-seqs": {"type": "categorical", "choices": [2, 4], "default": 4}}}))
    sweep = short_tmp / "keyed.yaml"
    sweep.write_text(yaml.safe_dump(join_shared({
        "name": "keyed", "model": str(tiny_model), "search_space": str(space), "engine": "fake",
        "server": {"startup_timeout_s": 60, "reuse": False, "secret_env": ["HF_TOKEN"],
                   "env": {"FAKE_ENGINE_STARTUP_S": "0", "FAKE_ENGINE_TTFT_MS": "5",
                           "FAKE_ENGINE_TPOT_MS": "1"}},
        "workload": {"num_prompts": 4, "input_len": 8, "output_len": 4, "max_concurrency": 2,
                     "warmup_requests": 0},
        "search": {**NO_REMEASURE, "n_trials": 1, "seed": 1},
        "results_dir": str(short_tmp / "results"),
    }, shared_ray)))

    res = run_joined(shared_ray, ["run", str(sweep)], short_tmp)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert len(seen) == 1, seen
    key, bare, wrong = seen[0]
    assert key and (bare, wrong) == (401, 401), seen
    trials = read_trials(short_tmp / "results", "keyed")
    assert list(trials["state"]) == ["COMPLETE"], trials["fail_detail"]  # the key was sent
    exports = short_tmp / "exports"
    exports.mkdir()
    outputs = [res]
    for form in ("serve", "json", "ray-serve", "k8s"):
        outputs.append(cli_in_process("export", str(sweep), "--format", form,
                                      "-o", str(exports / form), cwd=short_tmp))
        assert outputs[-1].returncode == 0, outputs[-1].stderr[-2000:]
    outputs.append(cli_in_process("report", str(sweep), "--out", str(exports / "report.html"),
                                  cwd=short_tmp))
    assert outputs[-1].returncode == 0, outputs[-1].stderr[-2000:]
    files = [p for root in (short_tmp / "results", exports) for p in root.rglob("*") if p.is_file()]
    assert any(p.suffix == ".parquet" for p in files) and (exports / "k8s").is_file()
    # the run's server actor is in the table with the environment it was given (the shared
    # Ray's other actors, of earlier sweeps in this lane, are read too)
    actors = actor_table(shared_ray.address)
    assert any(a["class_name"] == "ServerActor" and "FAKE_ENGINE_TPOT_MS" in
               a["serialized_runtime_env"] for a in actors), actors
    for secret in (key, hf_token):
        leaked = [str(p) for p in files if secret.encode() in p.read_bytes()]
        printed = [o.args for o in outputs if secret in o.stdout + o.stderr]
        in_env = [a["class_name"] for a in actors if secret in a["serialized_runtime_env"]]
        assert leaked == [] and printed == [] and in_env == [], (secret[:3], leaked, printed,
                                                                  in_env)
    assert "--no-api-key" not in res.stdout + res.stderr

    opened = run_joined(shared_ray, ["run", str(sweep), "--add-trials", "1", "--no-api-key"],
                        short_tmp)
    assert opened.returncode == 0, opened.stdout[-3000:] + opened.stderr[-3000:]
    assert seen[1:] == [(None, 200, 200)], seen
    out = opened.stdout + opened.stderr
    assert out.count("warning: --no-api-key") == 1, out[-3000:]
