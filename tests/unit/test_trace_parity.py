"""benchmarks/trace_parity.py's verdicts, run order and pooling, trace_parity_aa's pair
differences (pure), and loadgen_parity.placement, the preexec_fn that pins a client or
server to CPUs for `--pin`."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys

import pytest

from benchmarks.loadgen_parity import placement
from benchmarks.paired import median_ci
from benchmarks.paired import pair_differences
from benchmarks.paired import paired_table
from benchmarks.trace_parity import CLIENTS
from benchmarks.trace_parity import lateness_ms
from benchmarks.trace_parity import pooled_median_ms
from benchmarks.trace_parity import request_tpots_ms
from benchmarks.trace_parity import run_order
from benchmarks.trace_parity import tpot_vs_server_pct
from benchmarks.trace_parity import verdicts
from benchmarks.trace_parity_aa import pair_diffs


def row(client: str, ttft: float, tpot: float, server_ttft: float, late: float,
        server_tpot: float = 2.5) -> dict:
    return {"client": client, "speed_up": 1.0, "completed": 3, "failed": 0,
            "input_tokens": 30, "output_tokens": 9, "input_lens": [10, 10, 10],
            "median_ttft_ms": ttft, "median_tpot_ms": tpot,
            "server_median_ttft_ms": server_ttft, "server_median_tpot_ms": server_tpot,
            "tpot_vs_server_pct": tpot_vs_server_pct(tpot, server_tpot), "late_max_ms": late}


def test_verdicts_judge_client_medians_and_report_the_servers_without_a_target() -> None:
    rows = [row(CLIENTS[0], 10.0, 3.0, 8.0, 2.0, 3.0), row(CLIENTS[1], 8.9, 3.1, 8.4, 60.0, 2.5),
            row(CLIENTS[1], 8.9, 3.1, 8.4, 1.0, 3.1)]
    lines = verdicts(rows)
    assert lines[0].endswith(": met")                                       # same counts
    assert lines[1] == "- 1x, median TTFT: ours -11.0% vs vllm bench (target within 10%): MISSED"
    assert lines[2] == "- 1x, median TPOT: ours +3.3% vs vllm bench (target within 10%): met"
    assert lines[3] == ("- 1x, server's median TTFT: ours +5.0% vs vllm bench "
                        "(the server under each client; no target)")
    assert lines[4] == ("- 1x, server's median TPOT: ours -6.7% vs vllm bench "
                        "(the server under each client; no target)")
    assert lines[5] == ("- 1x, each client's median TPOT vs the server's own in the same run, "
                        "median [min..max] over runs: vllm bench serve +0.0% [+0.0..+0.0%]; "
                        "vllm-sweep bench +12.0% [+0.0..+24.0%] (what the client adds, the "
                        "server's state cancelled; no target)")
    assert lines[6].endswith("vllm bench serve worst 2.0 ms: met; vllm-sweep bench worst "
                             "60.0 ms: MISSED")


def test_tpot_vs_server_is_the_clients_excess_over_the_servers_own_median() -> None:
    assert tpot_vs_server_pct(5.5, 5.0) == pytest.approx(10.0)
    assert tpot_vs_server_pct(4.5, 5.0) == pytest.approx(-10.0)


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


VL, US = CLIENTS
ALT4 = [(VL, US), (US, VL), (VL, US), (US, VL)]


@pytest.mark.parametrize(("order", "runs", "seed", "expected"), [
    ("alternate", 4, 0, ALT4),
    ("alternate", 3, 7, ALT4[:3]),             # the seed plays no part
    ("random", 4, 0, [(VL, US), (VL, US), (US, VL), (US, VL)]),
    ("random", 4, 1, [(US, VL), (VL, US), (VL, US), (US, VL)]),
    ("random", 3, 2, [(US, VL), (VL, US), (VL, US)]),
    ("random", 1, 0, [(US, VL)]),
    ("random", 0, 0, []),
])
def test_run_order(order: str, runs: int, seed: int, expected: list) -> None:
    assert run_order(order, runs, random.Random(seed)) == expected


@pytest.mark.parametrize("runs", [2, 5, 6, 9])
def test_random_order_gives_each_client_the_same_runs_and_balanced_first_places(runs: int) -> None:
    for seed in range(20):
        pairs = run_order("random", runs, random.Random(seed))
        assert len(pairs) == runs and all(sorted(p) == sorted(CLIENTS) for p in pairs)
        firsts = sum(p[0] == US for p in pairs)
        assert runs // 2 <= firsts <= runs - runs // 2


def test_random_orders_differ_by_seed_and_unknown_order_raises() -> None:
    assert len({tuple(run_order("random", 6, random.Random(s))) for s in range(10)}) > 1
    with pytest.raises(ValueError):
        run_order("shuffle", 2, random.Random(0))


def test_request_tpot_is_itl_sum_over_tokens_minus_one_and_skips_single_tokens() -> None:
    tpots = request_tpots_ms([3, 1, 0, 5], [[0.002, 0.004], [], [], [0.001] * 4])
    assert [round(x, 9) for x in tpots] == [3.0, 1.0]


def test_pooled_median_sums_the_runs_buckets() -> None:
    inf = math.inf
    run_a = [[0.01, 3], [0.02, 3], [inf, 3]]  # 3 observations in (0, 10 ms]
    run_b = [[0.01, 0], [0.02, 1], [inf, 1]]  # 1 observation in (10, 20 ms]
    # 4 pooled: rank 2 falls in the first bucket at 2/3 of its width
    assert round(pooled_median_ms([run_a, run_b]), 6) == round(1000 * 0.01 * 2 / 3, 6)
    assert round(pooled_median_ms([run_b]), 6) == 15.0


def test_aa_pair_diffs_compare_each_second_run_with_its_first() -> None:
    rows = [{"k": 2.0}, {"k": 3.0}, {"k": 4.0}, {"k": 2.0}, {"k": 9.0}]  # the odd run is unpaired
    assert pair_diffs(rows, "k") == [50.0, -50.0]


@pytest.mark.parametrize(("n", "k"), [(5, 0), (6, 1), (10, 2), (16, 4), (20, 6)])
def test_median_ci_takes_the_order_statistics_of_the_binomial_tail(n, k) -> None:
    """k = values cut from each end; the tail below k holds <= 2.5% (Conover 3.2): n = 6
    keeps x(1)..x(6) (P(B=0) = 1.6%), n = 10 x(2)..x(9) (P(B<=1) = 1.1%, P(B<=2) = 5.5%)."""
    values = [float(v) for v in range(n, 0, -1)]
    mid, lo, hi = median_ci(values)
    assert mid == (n + 1) / 2
    if k == 0:
        assert (lo, hi) == (-math.inf, math.inf)
    else:
        assert (lo, hi) == (float(k), float(n + 1 - k))


def test_paired_table_compares_within_each_pair_and_judges_the_median() -> None:
    """Drift between pairs (the server 2x slower in pair 2) cancels: ours is 5% above vllm
    bench in every pair, so the median is +5% whatever the level."""
    rows = []
    for pair, level in enumerate([10.0, 10.0, 20.0, 10.0, 11.0, 9.0]):
        rows += [{"pair": pair, "client": CLIENTS[0], "k": level},
                 {"pair": pair, "client": CLIENTS[1], "k": level * 1.05}]
    assert pair_differences(rows, "k", CLIENTS) == pytest.approx([0.05] * 6)
    line = paired_table(rows, CLIENTS, [("k", "metric", True)])[2]
    assert "+5.0% [+5.0% .. +5.0%]" in line and "6 of 6" in line and "met, CI inside" in line
    rows[1]["k"] = rows[3]["k"] = rows[5]["k"] = 100.0  # 3 pairs far off: the median moves
    assert "MISSED" in paired_table(rows, CLIENTS, [("k", "metric", True)])[2]
