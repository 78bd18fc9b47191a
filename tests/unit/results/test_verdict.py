"""results.verdict: a gain is named only beyond the measured noise; the defaults' SLA break is
stated as such; the winner's estimate leaves out the value that picked it."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from framework.results.verdict import Estimate
from framework.results.verdict import decide
from framework.results.verdict import gain_interval
from framework.results.verdict import sweep_noise

SLA = {"p99_tpot_ms": 4.5}


def row(number: int, objective: float, *, base: bool = False, of: int | None = None,
        tpot: float = 4.0, state: str = "COMPLETE", stopped: str | None = None) -> dict:
    return {"trial_number": number, "state": state, "is_baseline": base, "confirmation_of": of,
            "objective": objective, "feasible": tpot <= SLA["p99_tpot_ms"], "p99_tpot_ms": tpot,
            "objective_cv": None, "repeats": 1, "stopped_early": stopped,
            "serve_command": f"vllm serve m --n {number if of is None else of}"}


def frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows)


def sweep(base: tuple[float, ...], winner: float, confirms: tuple[float, ...],
          others: tuple[float, ...] = (900.0, 950.0), base_tpot: float = 4.0) -> pd.DataFrame:
    rows = [row(0, base[0], base=True, tpot=base_tpot)]
    rows += [row(1 + i, v) for i, v in enumerate(others)]
    w = len(rows)
    rows.append(row(w, winner))
    rows += [row(w + 1 + i, v, base=True, of=0, tpot=base_tpot) for i, v in enumerate(base[1:])]
    rows += [row(w + 10 + i, v, of=w) for i, v in enumerate(confirms)]
    return frame(rows)


def test_a_gain_inside_the_noise_is_not_distinguishable():
    trials = sweep(base=(1000.0, 1100.0, 950.0), winner=1150.0, confirms=(1040.0,))
    v = decide(trials, "output_throughput", True, SLA)
    assert v.kind == "not_distinguishable" and v.number is None
    assert v.gain is not None and v.gain.low < 0 < v.gain.high
    assert f"beyond ±{v.gain.half_width:.1%}" in v.headline
    assert "not distinguishable from vLLM's defaults" in v.headline


def test_a_gain_beyond_the_noise_names_the_winner():
    trials = sweep(base=(1000.0, 1010.0, 995.0), winner=1500.0, confirms=(1480.0, 1495.0))
    v = decide(trials, "output_throughput", True, SLA)
    assert v.kind == "winner" and v.number == 3
    assert v.gain is not None and v.gain.low > 0
    assert v.headline.startswith("Trial 3 beats vLLM's defaults")
    assert "tok/s" in v.headline


def test_the_winner_estimate_leaves_out_the_value_that_picked_it():
    trials = sweep(base=(1000.0, 1010.0, 995.0), winner=5000.0, confirms=(1480.0, 1495.0))
    v = decide(trials, "output_throughput", True, SLA)
    assert v.estimate is not None
    assert v.estimate.value == pytest.approx(math.sqrt(1480.0 * 1495.0))
    assert v.estimate.servers == 2


def test_defaults_that_break_the_sla_are_said_so_and_never_used_for_a_gain():
    trials = sweep(base=(1347.0, 5000.0, 5100.0), winner=4000.0, confirms=(3900.0,),
                   base_tpot=6.1)
    v = decide(trials, "output_throughput", True, SLA)
    assert v.kind == "winner" and v.number == 3 and v.gain is None
    assert v.headline.startswith("vLLM's defaults break your SLA: p99_tpot_ms 6.1 ms > 4.5 ms "
                                 "(mean of 3 fresh servers)")
    assert "gain" not in v.headline and "beats" not in v.headline  # no gain against it


def test_a_stopped_early_baseline_measurement_gives_no_value():
    trials = sweep(base=(100.0, 1000.0, 1010.0), winner=1500.0, confirms=(1490.0,))
    trials.loc[trials["trial_number"] == 0, "stopped_early"] = "p99_ttft_ms 900 > 500"
    v = decide(trials, "output_throughput", True, SLA)
    assert v.baseline is not None and v.baseline.servers == 2
    assert v.baseline.value == pytest.approx(math.sqrt(1000.0 * 1010.0))


def test_a_winner_whose_confirmation_broke_the_sla_is_not_named():
    trials = sweep(base=(1000.0, 1010.0, 995.0), winner=1500.0, confirms=(1490.0,))
    trials.loc[trials["confirmation_of"] == 3, ["feasible", "p99_tpot_ms"]] = [False, 5.5]
    v = decide(trials, "output_throughput", True, SLA)
    # the defaults met the SLA on their 3 servers: they ship, and the winner is not named
    assert v.kind == "not_distinguishable" and v.number is None and v.ship == 0
    assert v.headline.startswith("Only vLLM's defaults met your SLA")
    assert "no confirmed configuration met it" in v.headline


def test_a_sweep_of_the_defaults_alone_ships_them():
    trials = frame([row(0, 1000.0, base=True)])
    v = decide(trials, "output_throughput", True, SLA)
    assert v.kind == "not_distinguishable" and v.ship == 0 and v.baseline is not None
    assert "Ship vLLM's defaults" in v.headline


def test_without_fresh_server_repeats_the_noise_is_unknown_and_no_winner_is_named():
    trials = frame([row(0, 1000.0, base=True), row(1, 1500.0)])
    v = decide(trials, "output_throughput", True, SLA)
    assert v.kind == "not_distinguishable" and v.number is None
    assert "noise is unknown" in v.headline


def test_no_measured_trial_has_no_results():
    trials = frame([row(0, 0.0, base=True, state="FAIL")])
    assert decide(trials, "output_throughput", True, SLA).kind == "no_results"


@pytest.mark.parametrize("maximize, best, base, expected", [
    (True, 110.0, 100.0, 0.10),
    (False, 90.0, 100.0, 0.10),   # a latency 10% lower is a 10% gain
    (False, 110.0, 100.0, -0.10),
])
def test_gain_direction(maximize, best, base, expected):
    b = Estimate(best, None, None, 2, 0.0001)
    a = Estimate(base, None, None, 3, 0.0001)
    g = gain_interval(b, a, 10, maximize)
    assert g is not None and g.value == pytest.approx(expected, abs=1e-9)
    assert g.low < g.value < g.high


def test_sweep_noise_pools_the_baseline_and_the_confirmations():
    trials = sweep(base=(1000.0, 1100.0, 950.0), winner=1150.0, confirms=(1040.0,))
    noise = sweep_noise(trials)
    assert noise.df == 3  # baseline: 3 servers (2 df), winner: 2 servers (1 df)
    assert noise.server_var is not None and 0.003 < noise.server_var < 0.02


def with_speed(trials: pd.DataFrame, speeds: dict[int, float]) -> pd.DataFrame:
    """`trials` with a searched speed-up column: each origin's setting (its confirmations')."""
    origin = trials["confirmation_of"].astype(float).fillna(trials["trial_number"]).astype(int)
    return trials.assign(param_speed_up=[speeds.get(o, 1.0) for o in origin])


def test_a_gain_that_came_from_a_load_setting_is_never_a_winner():
    """The trace_replay case (#34): the trial replayed 3x faster carries 3x the tokens, beyond
    any noise; today's verdict named it the winner (+199%). Ranked at the baseline's load
    alone, it is left out and said so."""
    trials = with_speed(sweep(base=(1000.0, 1010.0, 995.0), winner=3000.0,
                              confirms=(2990.0, 3010.0)), {3: 3.0})
    v = decide(trials, "output_throughput", True, SLA)
    assert v.number != 3 and v.ship != 3
    assert v.kind == "defaults_better"  # the 900 and 950 tok/s trials, at the baseline's pace
    assert v.lines[-1].startswith("Ranked at speed-up=1.0 only: trial(s) 3 (speed-up=3.0) ran "
                                  "another offered load")


def test_a_winner_at_the_baselines_load_is_still_named_beside_a_faster_replay():
    trials = with_speed(sweep(base=(1000.0, 1010.0, 995.0), winner=1500.0,
                              confirms=(1480.0, 1495.0), others=(900.0, 2900.0)), {2: 3.0})
    v = decide(trials, "output_throughput", True, SLA)
    assert v.kind == "winner" and v.number == 3
    assert "trial(s) 2 (speed-up=3.0)" in v.lines[-1]


def test_one_load_setting_for_every_trial_changes_nothing():
    plain = sweep(base=(1000.0, 1010.0, 995.0), winner=1500.0, confirms=(1480.0, 1495.0))
    v = decide(with_speed(plain, {}), "output_throughput", True, SLA)
    assert v == decide(plain, "output_throughput", True, SLA)
