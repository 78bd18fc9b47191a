"""The HTML report and the per-trial diagnosis.

(a) diagnosis rules, table-tested at their thresholds; (b) the report of a real results folder:
a 4-trial FakeEngine sweep on an emulated one-node Ray with 2 fake GPUs (one trial asks for
TP=4 and fails as unplaceable), rendered to HTML, opened in headless Chromium (tests/browser.py).
"""

from __future__ import annotations

import html
import math
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
import yaml

from framework.results.diagnosis import (
    BATCH_FILL_LOW,
    KV_EXHAUSTED_AT,
    PREEMPTION_RATE_LIMIT,
    VERDICTS,
    diagnose,
)
from framework.results.html_report import render_report
from framework.results.queries import pareto_front
from framework.config.search_space import SearchSpace
from framework.config.specs import SweepSpec, load_sweep
from framework.results.store import ResultStore
from framework.search.tuner import Evaluation, Tuner, param_importances
from tests.browser import check_report, external_references, render
from tests.helpers import ROOT, emulated_cluster, joined_cli_env, run_cli

SLA = {"p99_ttft_ms": 500.0, "p99_tpot_ms": 10.0}
HEALTHY = {"state": "COMPLETE", "completed": 200, "max_concurrent_requests": 32,
           "running_requests_max": 30, "waiting_requests_max": 0, "kv_cache_usage_max": 0.4,
           "kv_cache_usage_mean": 0.3, "preemptions": 0, "queue_time_mean_s": 0.01,
           "mean_ttft_ms": 80.0, "p99_ttft_ms": 200.0, "p99_tpot_ms": 8.1, "param_max_num_seqs": 64}


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
     ["0.98", "12 requests waiting"]),
    (case(kv_cache_usage_max=KV_EXHAUSTED_AT, waiting_requests_max=1), SLA,
     "kv_cache_exhausted", ["0.95", "1 requests waiting"]),
    (case(kv_cache_usage_max=0.949, waiting_requests_max=5), SLA, "near_optimal", ["0.95"]),
    (case(kv_cache_usage_max=0.99, waiting_requests_max=0), SLA, "near_optimal", ["0.99"]),
    (case(running_requests_max=4, kv_cache_usage_max=0.1, param_max_num_seqs=4,
          waiting_requests_max=28, p99_ttft_ms=900.0), SLA, "batch_too_small",
     ["4 of 32", "max-num-seqs 4", "12%", "0.10"]),  # precedence over the prefill rule
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
    (case(), SLA, "near_optimal", ["0.40", "0 preemptions", "30 of 32", "0 waiting"]),
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
    assert (PREEMPTION_RATE_LIMIT, KV_EXHAUSTED_AT, BATCH_FILL_LOW) == (0.01, 0.95, 0.5)


def test_pareto_front_keeps_the_points_nothing_beats():
    latency = [100.0, 200.0, 150.0, 300.0, 120.0]
    throughput = [10.0, 30.0, 5.0, 25.0, 20.0]
    assert pareto_front(list(zip(latency, throughput)), [False, True]) == [0, 4, 1]
    # of equal points the first stays; maximizing both puts the best first metric first
    assert pareto_front([(1.0, 2.0), (1.0, 2.0), (2.0, 1.0)], [True, True]) == [2, 0]


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
    assert journal.read_bytes() == before


# ---- reports of a real results folder (FakeEngine sweep) --------------------------------------

NAME = "fake-report"


@dataclass(frozen=True)
class FakeSweep:
    folder: Path
    sweep: Path
    spec: SweepSpec

    @property
    def store(self) -> ResultStore:
        return ResultStore(self.spec.results_dir, self.spec.name)


def write_fake_sweep(folder: Path, model: Path, address: str | None) -> Path:
    space = folder / "space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        "max-num-seqs": {"type": "categorical", "choices": [2, 8, 128], "default": 128},
        "tensor-parallel-size": {"type": "categorical", "choices": [1, 4], "default": 1},
    }}, sort_keys=False))
    sweep = folder / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": NAME, "model": str(model), "search_space": str(space), "engine": "fake",
        "server": {"host": "node", "env": {"FAKE_ENGINE_STARTUP_S": "0",
                                            "FAKE_ENGINE_TTFT_MS": "30",
                                            "FAKE_ENGINE_TPOT_MS": "10"}},
        "workload": {"num_prompts": 32, "input_len": 8, "output_len": 32, "max_concurrency": 8,
                     "warmup_requests": 0, "request_timeout_s": 60},
        "sla": {"p99_ttft_ms": 500, "p99_tpot_ms": 50},
        # after the baseline, seed 10 proposes max-num-seqs 2 (TTFT over the SLA), 128, then
        # TP 4 (cannot be placed on 2 GPUs)
        # full runs: a run stopped early (SLA surely broken) keeps only its finished requests,
        # and the batch-too-small diagnosis below reads the whole run
        "search": {"sampler": "random", "n_trials": 4, "baseline": True, "seed": 10,
                   "stop_early": False},
        "cluster": {"address": address, "max_concurrent_trials": 1},
        "results_dir": str(folder / "results"),
    }))
    return sweep


@pytest.fixture(scope="module")
def fake_sweep(tiny_model) -> Iterator[FakeSweep]:
    folder = Path(tempfile.mkdtemp(prefix="vst-"))
    try:
        with emulated_cluster(folder, [{"num_cpus": 4, "num_gpus": 2}]) as (_, address, marker):
            sweep = write_fake_sweep(folder, tiny_model, address)
            res = run_cli(["run", str(sweep)], folder, joined_cli_env(marker, folder), timeout_s=240)
        assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
        yield FakeSweep(folder, sweep, load_sweep(sweep))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class _TrialTable(HTMLParser):
    """The body rows of <table id='trials'>, each as its cells' texts (a cell's bold text, the
    diagnosis verdict, first)."""

    def __init__(self) -> None:
        super().__init__()
        self.in_table = self.in_body = self.in_bold = False
        self.rows: list[list[str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table" and ("id", "trials") in attrs:
            self.in_table = True
        elif self.in_table and tag == "tbody":
            self.in_body = True
        elif self.in_body and tag == "tr":
            self.rows.append([])
        elif self.in_body and tag == "td":
            self.rows[-1].append("")
        elif self.in_body and tag == "b":
            self.in_bold = True

    def handle_data(self, data: str) -> None:
        if self.in_body and self.rows and self.rows[-1]:
            self.rows[-1][-1] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "b" and self.in_bold and self.rows and self.rows[-1]:
            self.rows[-1][-1] += "|"  # ends the verdict
            self.in_bold = False
        if tag == "tbody":
            self.in_body = False
        if tag == "table":
            self.in_table = False


def trial_table(text: str) -> dict[int, list[str]]:
    """Trial number -> its row's cells in the report's trial table."""
    parser = _TrialTable()
    parser.feed(text)
    return {int(cells[0].rstrip("*")): cells for cells in parser.rows}


def trial_table_rows(text: str) -> int:
    return len(trial_table(text))


@pytest.mark.timeout(300)
def test_report_of_a_fake_sweep_renders_in_chromium(fake_sweep, tmp_path):
    trials = fake_sweep.store.read_trials()
    assert len(trials) == 4 and set(trials["trial_number"]) == {0, 1, 2, 3}
    failed = trials[trials["state"] == "FAIL"]
    assert list(failed["fail_reason"]) == ["unplaceable"], trials[["state", "fail_reason"]]
    importances = param_importances(fake_sweep.store.journal_path, NAME)
    assert list(importances) == ["max-num-seqs"]  # TP differs only in the failed trial
    out = render_report(trials, fake_sweep.spec, importances, tmp_path / "report.html")

    text = out.read_text(encoding="utf-8")
    assert external_references(text) == []
    best = trials[(trials["state"] == "COMPLETE") & (trials["feasible"] == True)]  # noqa: E712
    best = best.loc[best["objective"].idxmax()]
    assert html.escape(best["serve_command"], quote=False) in text
    assert trial_table_rows(text) == len(trials)
    failures = text[text.index("<h2>Failures</h2>"):]
    number = int(failed.iloc[0]["trial_number"])
    assert f"trial {number}: <b class='fail'>unplaceable</b>" in failures
    assert html.escape(str(failed.iloc[0]["fail_detail"]), quote=False) in failures
    # what each row must say, known from how the trials were set up, not from the report's code
    table = trial_table(text)
    verdict = {n: next(c.split("|")[0] for c in cells if "|" in c) for n, cells in table.items()}
    small = int(trials[trials["param_max_num_seqs"] == 2].iloc[0]["trial_number"])
    assert verdict[small] == "batch_too_small"  # 2 slots for 8 requests in flight
    assert "SLA violated" in table[small]
    assert verdict[number] == "not_measured" and "FAIL(unplaceable)" in table[number]
    assert set(verdict.values()) <= set(VERDICTS)

    result = check_report(out, min_plots=3)
    assert result.title == f"vllm-sweep report: {NAME}"


@pytest.mark.timeout(300)
def test_report_without_feasible_or_completed_trials_is_sentences(fake_sweep, tmp_path):
    trials = fake_sweep.store.read_trials()
    infeasible = trials.assign(feasible=trials["feasible"].map(lambda v: False if v else v))
    out = render_report(infeasible, fake_sweep.spec, None, tmp_path / "infeasible.html")
    text = out.read_text(encoding="utf-8")
    assert "No feasible configuration: none of the 3 completed trials met the SLA" in text
    assert "No parameter importances" in text
    assert trial_table_rows(text) == len(trials)

    only_failed = trials[trials["state"] == "FAIL"].reset_index(drop=True)
    out = render_report(only_failed, fake_sweep.spec, {}, tmp_path / "failed.html")
    text = out.read_text(encoding="utf-8")
    assert "No trial completed (1 failed)" in text
    assert "nothing to plot" in text and "no effect to plot" in text
    assert trial_table_rows(text) == 1
    result = render(out, tmp_path / "failed.png")
    assert result.console_errors == [] and result.page_errors == [] and result.plot_count == 0


@pytest.mark.timeout(300)
def test_cli_report_writes_the_default_path_and_out(fake_sweep, tmp_path):
    res = subprocess.run([sys.executable, "-m", "framework.cli", "report", str(fake_sweep.sweep)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    expected = fake_sweep.store.sweep_dir / "report.html"
    assert res.stdout.strip() == str(expected) and expected.is_file()
    target = tmp_path / "sub" / "mine.html"
    res = subprocess.run([sys.executable, "-m", "framework.cli", "report", str(fake_sweep.sweep),
                          "--out", str(target)], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == str(target) and target.is_file()


def test_cli_report_of_a_sweep_without_results_is_one_line_exit_2(tmp_path, tiny_model):
    sweep = write_fake_sweep(tmp_path, tiny_model, None)
    res = subprocess.run([sys.executable, "-m", "framework.cli", "report", str(sweep)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.strip().splitlines() == [
        f"error: sweep '{NAME}' has no results yet in {tmp_path / 'results' / NAME}"]
    assert not (tmp_path / "results" / NAME / "report.html").exists()


def test_cli_report_of_a_bad_sweep_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: /no/such/model\nsearch_space: nowhere.yaml\n")
    res = subprocess.run([sys.executable, "-m", "framework.cli", "report", str(bad)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
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
