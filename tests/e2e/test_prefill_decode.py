"""sweeps/prefill_decode_cpu.yaml on real parts (vLLM CPU servers on the shared Ray, vLLM's own
ExampleConnector, Parquet read back), kept small (24 requests, no confirmation runs): one
server against one prefill + one decode server (#36). Guards: a 1P1D trial whose decode server
loads no KV (the row's kv_transfer_tokens, from vLLM's external_kv_transfer prompt tokens), a
decode server whose greedy answers differ from the single server's (the quality probe against
the baseline's reference), requests that skip the prefill server, and the shape reaching the
rows and the export."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.cli import run_joined
from tests.clusters import join_shared
from tests.sweeps import read_requests
from tests.sweeps import read_trials
from tests.sweeps import shipped_example

pytestmark = pytest.mark.server

PROMPTS = 24


@pytest.mark.timeout(900)
def test_one_prefill_and_one_decode_server_hand_the_kv_over(shared_ray, tiny_model, short_tmp):
    sweep = shipped_example("prefill_decode_cpu", tiny_model, short_tmp, PROMPTS)
    # the shape and its rows are tested: no latency SLA to break on this machine's speed; the
    # quality probe's agreement stays an SLA
    sweep["sla"] = {"p99_ttft_ms": 600_000, "min_token_agreement": 0.98}
    path = short_tmp / "prefill_decode_cpu.yaml"
    path.write_text(yaml.safe_dump(join_shared(sweep, shared_ray)))
    done = run_joined(shared_ray, ["run", str(path)], short_tmp)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    trials = read_trials(short_tmp / "results", "prefill_decode_cpu")
    assert (trials["state"] == "COMPLETE").all(), trials[["fail_reason", "fail_detail"]]
    assert (trials["completed"] == PROMPTS).all()
    pd_rows = trials[trials["param_prefill_servers"] == 1]
    assert len(pd_rows) == 1, trials[["trial_number", "param_prefill_servers"]]
    pd_row = pd_rows.iloc[0]
    assert pd_row["shape"] == "1P1DxTP1xPP1"
    assert len(pd_row["placement"]) == 2  # a bundle per server
    # the decode server loaded every measured prompt's KV: whole 32-token blocks of the
    # 128-token prompts but their last token, (128 - 2) // 32 x 32 = 96 tokens each
    assert pd_row["kv_transfer_tokens"] >= PROMPTS * 96, pd_row["kv_transfer_tokens"]
    argv = list(pd_row["vllm_argv"])
    assert json.loads(argv[argv.index("--kv-transfer-config") + 1])["kv_connector"] == \
        "ExampleConnector"
    # its greedy answers are the single server's (the baseline's reference)
    assert pd_row["token_agreement"] == pytest.approx(1.0), pd_row["token_agreement"]
    single = trials[trials["param_prefill_servers"] == 0]
    assert (single["shape"] == "TP1xPP1").all() and single["kv_transfer_tokens"].fillna(0).eq(0).all()
    # every request of the P/D trial was answered by its one decode server
    requests = read_requests(short_tmp / "results", "prefill_decode_cpu")
    mine = requests[requests["trial_number"] == pd_row["trial_number"]]
    assert len(mine) == PROMPTS and (mine["replica"] == 0).all()

    export = run_joined(shared_ray, ["export", str(path), "--format", "json"], short_tmp)
    assert export.returncode == 0, export.stdout[-2000:] + export.stderr[-2000:]
    shipped = json.loads(export.stdout)
    assert "prefill-servers" not in shipped["flags"]
