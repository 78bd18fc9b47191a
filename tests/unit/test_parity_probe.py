"""benchmarks/parity.py's TTFT split: transport-probe pairs matched to requests by their own
start and first-token stamps (pure)."""

from __future__ import annotations

import pytest

from benchmarks.parity import decompose


def test_each_pair_goes_to_the_request_it_timed() -> None:
    # request 0: start 0.0, first stamp 0.050; request 1: start 0.010, stamp 0.045
    starts, ttfts = [0.0, 0.010], [0.050, 0.035]
    pairs = [[0.0105, 0.0440], [0.0010, 0.0480]]  # (written, read) of request 1, then 0
    out = decompose(starts, ttfts, pairs)
    assert out["matched"] == 1.0
    # send leads 0.5 and 1.0 ms, wires 33.5 and 47.0 ms, receive lags 1.0 and 2.0 ms
    assert out["send_lead_ms"] == pytest.approx(0.75)
    assert out["wire_ms"] == pytest.approx(40.25)
    assert out["receive_lag_ms"] == pytest.approx(1.5)
    assert out["matched_ttft_ms"] == pytest.approx(42.5)  # the two TTFTs' mean: the parts add up


def test_unmatched_pairs_and_failed_requests_are_left_out() -> None:
    starts, ttfts = [0.0, 1.0], [0.02, 0.0]  # request 1 failed (TTFT 0)
    pairs = [[0.001, 0.015], [5.0, 5.01]]    # the second read has no request after it
    out = decompose(starts, ttfts, pairs)
    assert out["matched"] == 1.0 and out["wire_ms"] == pytest.approx(14.0)
    assert decompose([], [], [])["send_lead_ms"] is None
