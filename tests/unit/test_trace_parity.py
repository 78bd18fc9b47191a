"""benchmarks/trace_parity.py's verdicts (pure) and loadgen_parity.placement, the preexec_fn
that pins a client or server to CPUs for `--pin`."""

from __future__ import annotations

import os
import subprocess
import sys

from benchmarks.loadgen_parity import placement
from benchmarks.trace_parity import CLIENTS
from benchmarks.trace_parity import lateness_ms
from benchmarks.trace_parity import verdicts


def row(client: str, ttft: float, tpot: float, server_ttft: float, late: float) -> dict:
    return {"client": client, "speed_up": 1.0, "completed": 3, "failed": 0,
            "input_tokens": 30, "output_tokens": 9, "input_lens": [10, 10, 10],
            "median_ttft_ms": ttft, "median_tpot_ms": tpot,
            "server_median_ttft_ms": server_ttft, "late_max_ms": late}


def test_verdicts_judge_client_medians_and_report_the_servers_without_a_target() -> None:
    rows = [row(CLIENTS[0], 10.0, 3.0, 8.0, 2.0), row(CLIENTS[1], 8.9, 3.1, 8.4, 60.0)]
    lines = verdicts(rows)
    assert lines[0].endswith(": met")                                       # same counts
    assert lines[1] == "- 1x, median TTFT: ours -11.0% vs vllm bench (target within 10%): MISSED"
    assert lines[2] == "- 1x, median TPOT: ours +3.3% vs vllm bench (target within 10%): met"
    assert lines[3] == ("- 1x, server's median TTFT: ours +5.0% vs vllm bench "
                        "(the server under each client; no target)")
    assert lines[4].endswith("vllm bench serve worst 2.0 ms: met; vllm-sweep bench worst "
                             "60.0 ms: MISSED")


def test_different_token_counts_miss() -> None:
    other = {**row(CLIENTS[1], 10.0, 3.0, 8.0, 1.0), "output_tokens": 8}
    assert verdicts([row(CLIENTS[0], 10.0, 3.0, 8.0, 1.0), other])[0].endswith("MISSED")


def test_lateness_is_measured_from_request_zero() -> None:
    late = lateness_ms([5.0, 5.1015, 5.3], [0.0, 0.1, 0.3])
    assert [round(x, 6) for x in late] == [0.0, 1.5, 0.0]


def child(preexec) -> str:
    code = "import os; print(sorted(os.sched_getaffinity(0)), os.getpriority(os.PRIO_PROCESS, 0))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, preexec_fn=preexec).stdout.strip()


def test_placement_pins_and_renices_only_the_child() -> None:
    assert placement(None, None) is None
    cpu = min(os.sched_getaffinity(0))
    assert child(placement(19, frozenset({cpu}))) == f"[{cpu}] 19"
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    assert child(placement(None, frozenset({cpu}))) == f"[{cpu}] {mine}"
    assert os.getpriority(os.PRIO_PROCESS, 0) == mine  # the parent untouched
