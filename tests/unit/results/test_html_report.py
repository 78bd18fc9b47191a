"""The HTML report and the per-trial diagnosis.

(a) diagnosis rules, table-tested at their thresholds; (b) the report of a real results folder:
a 4-trial FakeEngine sweep on an emulated one-node Ray with 2 fake GPUs (one trial asks for
TP=4 and fails as unplaceable), rendered to HTML, opened in headless Chromium (tests/browser.py).
"""

from __future__ import annotations

import html
import math
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from framework.config.search_space import SearchSpace
from framework.config.specs import SweepSpec
from framework.results.diagnosis import BATCH_FILL_LOW
from framework.results.diagnosis import KV_EXHAUSTED_AT
from framework.results.diagnosis import MIN_LOAD_SAMPLES
from framework.results.diagnosis import PREEMPTION_RATE_LIMIT
from framework.results.diagnosis import VERDICTS
from framework.results.diagnosis import diagnose
from framework.results.html_report import render_report
from framework.results.queries import pareto_front
from framework.search.tuner import Evaluation
from framework.search.tuner import Tuner
from framework.search.tuner import param_importances
from tests.cli import cli_in_process
from tests.sweeps import NAME
from tests.sweeps import write_fake_sweep

SLA = {"p99_ttft_ms": 500.0, "p99_tpot_ms": 10.0}


HEALTHY = {"state": "COMPLETE", "completed": 200, "max_concurrent_requests": 32,
           "running_requests_max": 30, "waiting_requests_max": 0, "kv_cache_usage_max": 0.4,
           "kv_cache_usage_mean": 0.3, "preemptions": 0, "queue_time_mean_s": 0.01,
           "mean_ttft_ms": 80.0, "p99_ttft_ms": 200.0, "p99_tpot_ms": 8.1, "param_max_num_seqs": 64}


STOPPED = "p99_tpot_ms: at least 14.3 ms whatever the other 197 requests do (3 done)"


def case(**changes: object) -> dict[str, object]:
    return {**HEALTHY, **changes}


# (row, sla, expected verdict, texts the sentence must contain)
DIAGNOSIS_CASES = [
    (case(state="FAIL", fail_reason="unplaceable"), SLA, "not_measured", ["unplaceable"]),
    (case(completed=None), SLA, "not_measured", ["n/a"]),
    (case(completed=0), SLA, "not_measured", ["0"]),
    (case(kv_cache_usage_max=None, kv_cache_usage_mean=None, preemptions=None,
          waiting_requests_max=None, running_requests_max=None, queue_time_mean_s=math.nan),
     SLA, "not_measured", []),
    (case(preemptions=3), SLA, "too_many_sequences", ["3 preemptions", "200", "1.5%", "1%"]),
    (case(preemptions=2), SLA, "near_optimal", ["2 preemptions"]),  # exactly 1%: not above
    (case(preemptions=9, kv_cache_usage_max=0.99, waiting_requests_max=5), SLA,
     "too_many_sequences", ["9 preemptions"]),  # precedence over the KV rule
    (case(kv_cache_usage_max=0.98, waiting_requests_max=12), SLA, "kv_cache_exhausted",
     ["98%", "12 requests waiting"]),
    (case(kv_cache_usage_max=KV_EXHAUSTED_AT, waiting_requests_max=1), SLA,
     "kv_cache_exhausted", ["95%", "1 requests waiting"]),
    (case(kv_cache_usage_max=0.949, waiting_requests_max=5), SLA, "near_optimal", ["94.9%"]),
    (case(kv_cache_usage_max=0.99, waiting_requests_max=0), SLA, "near_optimal", ["99%"]),
    (case(running_requests_max=4, kv_cache_usage_max=0.1, param_max_num_seqs=4,
          waiting_requests_max=28, p99_ttft_ms=900.0), SLA, "batch_too_small",
     ["4 of 32", "max-num-seqs 4", "12%", "10%"]),  # precedence over the prefill rule
    (case(running_requests_max=16, kv_cache_usage_max=0.1), SLA, "near_optimal",
     ["16 of 32"]),  # exactly BATCH_FILL_LOW: not below
    (case(running_requests_max=4, kv_cache_usage_max=0.5), SLA, "near_optimal", ["4 of 32"]),
    (case(running_requests_max=4, kv_cache_usage_max=0.1, param_max_num_seqs=None), SLA,
     "batch_too_small", ["4 of 32"]),
    (case(p99_ttft_ms=812.0, queue_time_mean_s=0.6, mean_ttft_ms=700.0), SLA,
     "prefill_too_slow", ["812", "500", "8.1", "10 ms", "600 ms", "700 ms"]),
    (case(p99_ttft_ms=812.0, p99_tpot_ms=12.0), SLA, "near_optimal", []),  # decode is slow too
    (case(p99_ttft_ms=812.0), None, "near_optimal", []),  # no SLA to judge TTFT by
    (case(p99_ttft_ms=500.0), SLA, "near_optimal", []),  # at the limit is within it
    (case(), SLA, "near_optimal", ["40%", "0 preemptions", "30 of 32", "0 waiting"]),
    # a 0.7 s load stopped early, scraped once while it ran: its peaks are an idle server's
    (case(running_requests_max=0, max_concurrent_requests=12, completed=12, kv_cache_usage_max=0.0,
          metrics_samples=1, bench_s=0.72), SLA, "too_few_samples",
     ["(1, at least 3 needed)", "0.72 s load", "0 preemptions for 12 completed"]),
    (case(metrics_samples=0, p99_ttft_ms=900.0), SLA, "too_few_samples", ["(0, "]),
    (case(metrics_samples=2, preemptions=9), SLA, "too_many_sequences",
     ["9 preemptions"]),  # a counter's delta needs only the scrapes around the load
    (case(metrics_samples=3, running_requests_max=4, kv_cache_usage_max=0.1), SLA,
     "batch_too_small", ["4 of 32"]),  # 3 scrapes are enough
    # stopped early after 3 requests (a real quickstart trial): the client saw 3 finish, the
    # server held 2 running and 30 waiting: the batch is too small, not "2 of 3"
    (case(stopped_early=STOPPED, max_concurrent_requests=3, completed=3, running_requests_max=2,
          waiting_requests_max=30, kv_cache_usage_max=0.0005, param_max_num_seqs=2,
          metrics_samples=4), SLA, "batch_too_small", ["2 of 32", "max-num-seqs 2"]),
    (case(stopped_early=STOPPED, max_concurrent_requests=3, completed=3, running_requests_max=32,
          waiting_requests_max=0, kv_cache_usage_max=0.008, metrics_samples=5), SLA,
     "near_optimal", ["32 of 32"]),  # not "32 of 3"
    # capacity mode: measured at a step that held the SLA, in full: the client's peak stands
    (case(stopped_early=STOPPED, capacity_rps=6.5, running_requests_max=16,
          waiting_requests_max=30, kv_cache_usage_max=0.1), SLA, "near_optimal", ["16 of 32"]),
    (case(running_requests_max=math.nan, kv_cache_usage_max=math.nan), SLA, "near_optimal",
     ["n/a"]),
]


@pytest.mark.parametrize("row, sla, verdict, texts", DIAGNOSIS_CASES)
def test_diagnosis_rules(row, sla, verdict, texts):
    result = diagnose(row, sla)
    assert result.verdict == verdict, result
    assert result.text.endswith(".") and "\n" not in result.text
    for text in texts:
        assert text in result.text, (text, result.text)


def test_every_verdict_is_reachable_and_thresholds_are_the_seeds():
    assert {verdict for _, _, verdict, _ in DIAGNOSIS_CASES} == set(VERDICTS)
    assert (PREEMPTION_RATE_LIMIT, KV_EXHAUSTED_AT, BATCH_FILL_LOW, MIN_LOAD_SAMPLES) == (
        0.01, 0.95, 0.5, 3)


def test_pareto_front_keeps_the_points_nothing_beats():
    latency = [100.0, 200.0, 150.0, 300.0, 120.0]
    throughput = [10.0, 30.0, 5.0, 25.0, 20.0]
    assert pareto_front(list(zip(latency, throughput)), [False, True]) == [0, 4, 1]
    # equal points are all kept; maximizing both puts the best first metric first
    assert pareto_front([(1.0, 2.0), (1.0, 2.0), (2.0, 1.0)], [True, True]) == [2, 0, 1]


def _space() -> SearchSpace:
    return SearchSpace.model_validate({"parameters": {
        "max-num-seqs": {"type": "categorical", "choices": [2, 8, 128], "default": 128},
        "enable-prefix-caching": {"type": "bool", "default": True}}})


def test_param_importances_of_degenerate_and_real_studies(tmp_path):
    assert param_importances(tmp_path / "missing.journal", "x") == {}
    journal = tmp_path / "optuna.journal"
    tuner = Tuner(journal, "x", _space(), ["maximize"], "random", 0, 2)
    assert param_importances(journal, "nope") == {}
    tuner.enqueue_baseline({"max-num-seqs": 128, "enable-prefix-caching": True})
    tuner.tell(tuner.ask(), Evaluation(1.0, {}))
    assert param_importances(journal, "x") == {}  # one completed trial
    tuner.study.enqueue_trial({"max-num-seqs": 128, "enable-prefix-caching": True})
    tuner.tell(tuner.ask(), Evaluation(2.0, {}))
    assert param_importances(journal, "x") == {}  # two trials, same parameters
    for value in (2, 8, 2, 8):
        tuner.study.enqueue_trial({"max-num-seqs": value, "enable-prefix-caching": True})
        tuner.tell(tuner.ask(), Evaluation(float(value), {}))
    tuner.study.enqueue_trial({"max-num-seqs": 8, "enable-prefix-caching": False})
    tuner.fail(tuner.ask(), "startup_crash")  # a failed trial's parameters do not count
    before = journal.read_bytes()
    importances = param_importances(journal, "x")
    assert importances == {"max-num-seqs": pytest.approx(1.0)}
    # trials 2-5 (max-num-seqs 2, 8, 2, 8) left out, e.g. stopped early: 0 and 1 remain,
    # with equal parameters
    assert param_importances(journal, "x", exclude=range(2, 6)) == {}
    assert param_importances(journal, "x", exclude=[2]) == importances
    assert journal.read_bytes() == before


def test_cli_report_of_a_sweep_without_results_is_one_line_exit_2(tmp_path, tiny_model):
    sweep = write_fake_sweep(tmp_path, tiny_model, None)
    res = cli_in_process("report", str(sweep))
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.strip().splitlines() == [
        f"error: sweep '{NAME}' has no results yet in {tmp_path / 'results' / NAME}"]
    assert not (tmp_path / "results" / NAME / "report.html").exists()


def test_cli_report_of_a_bad_sweep_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: /no/such/model\nsearch_space: nowhere.yaml\n")
    res = cli_in_process("report", str(bad))
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert str(bad) in res.stderr and "Traceback" not in res.stderr


class _Tags(HTMLParser):
    """The start tags of a page, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.append(tag)


def _tags(text: str) -> list[str]:
    parser = _Tags()
    parser.feed(text)
    return parser.tags


def _report_of(tmp_path: Path, reason: str, detail: str, tail: str, param: str,
               version: str) -> str:
    """The report of one feasible trial and one failed trial carrying these strings."""
    common = {"serve_command": "vllm serve m", "param_max_num_seqs": param}
    trials = pd.DataFrame([
        {**common, "trial_number": 0, "state": "COMPLETE", "feasible": True,
         "is_baseline": True, "objective": 100.0, "output_throughput": 100.0,
         "p99_ttft_ms": 200.0, "p99_tpot_ms": 8.0, "fail_reason": None, "fail_detail": None,
         "log_tail": None, "vllm_version": "0.32"},
        {**common, "trial_number": 1, "state": "FAIL", "feasible": None, "is_baseline": False,
         "objective": math.nan, "output_throughput": math.nan, "p99_ttft_ms": math.nan,
         "p99_tpot_ms": math.nan, "fail_reason": reason, "fail_detail": detail,
         "log_tail": tail, "vllm_version": version},
    ])
    spec = SweepSpec.model_validate({"name": "x", "model": "m", "search_space": "s.yaml",
                                     "sla": SLA})
    out = render_report(trials, spec, None, tmp_path / f"{len(reason)}.html")
    return out.read_text(encoding="utf-8")


def test_row_text_reaches_the_report_escaped(tmp_path):
    reason = "<script>alert('reason')</script>"
    detail = "<img src=x onerror=alert('detail')>"
    tail = "line 1\n</pre><script>alert('tail')</script>"
    param = "<b onmouseover=alert('param')>64</b>"
    version = "<i>0.32</i>"
    text = _report_of(tmp_path, reason, detail, tail, param, version)

    for raw in (reason, detail, "</pre><script>", param, version):
        assert raw not in text
    assert f"FAIL({html.escape(reason, quote=False)})" in text  # the trial table's result
    assert f"<b class='fail'>{html.escape(reason, quote=False)}</b>" in text  # the failures
    assert html.escape(detail, quote=False) in text
    assert html.escape(tail, quote=False) in text
    assert html.escape(version) in text
    # the page's elements are those of the same report with harmless strings
    benign = _report_of(tmp_path, "startup_crash", "died", "line 1\nline 2", "64", "0.32")
    assert _tags(text) == _tags(benign)


def _shapes_report(tmp_path: Path, shapes: list[str]) -> str:
    trials = pd.DataFrame([
        {"trial_number": i, "state": "COMPLETE", "feasible": True, "is_baseline": i == 0,
         "objective": 100.0 + i, "output_throughput": 100.0 + i, "p99_ttft_ms": 200.0,
         "p99_tpot_ms": 8.0, "fail_reason": None, "fail_detail": None, "log_tail": None,
         "vllm_version": "0.32", "serve_command": "vllm serve m", "param_replicas": 1 + i,
         "shape": shape, "engines_served": 1 + i} for i, shape in enumerate(shapes)])
    spec = SweepSpec.model_validate({"name": "x", "model": "m", "search_space": "s.yaml",
                                     "sla": SLA})
    return render_report(trials, spec, None, tmp_path / f"{len(shapes)}.html").read_text()


def test_the_trial_table_shows_shapes_only_where_they_differ(tmp_path):
    """Guards #36's report: a sweep over deployment shapes names each trial's shape and the
    engines that served; a one-shape sweep's table is unchanged (no such column)."""
    mixed = _shapes_report(tmp_path, ["TP1xPP1", "2xTP1xPP1"])
    assert "<th>shape</th><th>engines served</th>" in mixed
    assert "<td>2xTP1xPP1</td><td>2</td>" in mixed
    same = _shapes_report(tmp_path, ["TP1xPP1"])
    assert "<th>shape</th>" not in same and "engines served" not in same
