"""The report of a real results folder: a 4-trial FakeEngine sweep on the session's shared Ray
(8 fake GPUs, driven in-process: tests.cli.run_joined; max-num-seqs 2 breaks the TTFT limit
and its run stops early; TP=16 fails as unplaceable), rendered to HTML and opened in headless
Chromium at 1400 px (tests/browser.py): units in the table's headers and on the plots' axes, the
trial stopped early marked and left out of the plots and importances, no column of the trial
table out of reach.
"""

from __future__ import annotations

import html
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
import yaml

from framework.config.search_space import load_search_space
from framework.config.specs import SweepSpec
from framework.config.specs import load_sweep
from framework.results.diagnosis import MIN_LOAD_SAMPLES
from framework.results.diagnosis import VERDICTS
from framework.results.html_report import render_report
from framework.results.store import ResultStore
from framework.results.verdict import decide
from framework.search.tuner import param_importances
from tests.browser import check_report
from tests.browser import external_references
from tests.browser import render
from tests.cli import cli_in_process
from tests.cli import run_joined
from tests.sweeps import NAME
from tests.sweeps import write_fake_sweep

# More ranks than the shared Ray's 8 fake GPUs: the TP the sweep's seed proposes last can never
# be placed (write_fake_sweep's space offers TP 4, which fits there; same place in the choices,
# so seed 10 proposes it at the same trial)
NEVER_FITS_TP = 16


@dataclass(frozen=True)
class FakeSweep:
    folder: Path
    sweep: Path
    spec: SweepSpec

    @property
    def store(self) -> ResultStore:
        return ResultStore(self.spec.results_dir, self.spec.name)


@pytest.fixture(scope="module")
def fake_sweep(tiny_model, shared_ray) -> Iterator[FakeSweep]:
    folder = Path(tempfile.mkdtemp(prefix="vst-"))
    try:
        sweep = write_fake_sweep(folder, tiny_model, shared_ray.address)
        space = folder / "space.yaml"
        doc = yaml.safe_load(space.read_text())
        tp = doc["parameters"]["tensor-parallel-size"]
        assert tp["choices"] == [1, 4], tp  # write_fake_sweep's: the second one replaced
        tp["choices"] = [1, NEVER_FITS_TP]
        space.write_text(yaml.safe_dump(doc, sort_keys=False))
        res = run_joined(shared_ray, ["run", str(sweep)], folder)
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
    shown = trials[["trial_number", "state", "fail_reason", "param_max_num_seqs",
                    "param_tensor_parallel_size", "stopped_early"]].to_string()
    assert len(trials) == 4 and set(trials["trial_number"]) == {0, 1, 2, 3}, shown
    failed = trials[trials["state"] == "FAIL"]
    assert list(failed["fail_reason"]) == ["unplaceable"], trials[["state", "fail_reason"]]
    small = int(trials[trials["param_max_num_seqs"] == 2].iloc[0]["trial_number"])
    early = trials[trials["stopped_early"].notna()]
    assert list(early["trial_number"]) == [small], trials[["trial_number", "stopped_early"]]
    assert early.iloc[0]["completed"] < 32 and not early.iloc[0]["feasible"]
    # Optuna ranks max-num-seqs on the short load alone (the others all ran 128; TP differs
    # only in the failed trial); without it nothing is left to rank
    journal = fake_sweep.store.journal_path
    assert list(param_importances(journal, NAME)) == ["max-num-seqs"]
    importances = param_importances(journal, NAME, exclude=[small])
    assert importances == {}
    out = render_report(trials, fake_sweep.spec, importances, tmp_path / "report.html",
                        space=load_search_space(fake_sweep.spec.search_space))

    text = out.read_text(encoding="utf-8")
    assert external_references(text) == []
    spec = fake_sweep.spec
    verdict = decide(trials, spec.objective.metric, spec.objective.direction == "maximize",
                     spec.sla)  # the report ships what the verdict ships, and says why
    shipped = trials[trials["trial_number"] == verdict.ship].iloc[0]
    assert html.escape(str(shipped["serve_command"]), quote=False) in text
    assert html.escape(verdict.headline, quote=False) in text
    assert trial_table_rows(text) == len(trials)
    failures = text[text.index("<h2>Failures</h2>"):]
    number = int(failed.iloc[0]["trial_number"])
    assert f"trial {number}: <b class='fail'>unplaceable</b>" in failures
    assert html.escape(str(failed.iloc[0]["fail_detail"]), quote=False) in failures
    # what each row must say, known from how the trials were set up, not from the report's code
    table = trial_table(text)
    verdict = {n: next(c.split("|")[0] for c in cells if "|" in c) for n, cells in table.items()}
    # 2 slots for the requests in flight, seen by the /metrics scrapes of its short load
    # (~3 s: ~6 scrapes; one with fewer than MIN_LOAD_SAMPLES, its scrapes stalled, must say so)
    enough = early.iloc[0]["metrics_samples"] >= MIN_LOAD_SAMPLES
    assert verdict[small] == ("batch_too_small" if enough else "too_few_samples"), early.iloc[0]
    done = int(early.iloc[0]["completed"] + early.iloc[0]["failed"])
    assert any(c.startswith("SLA violated: p99_ttft_ms ") and "ms > 1,500 ms (+" in c
               and c.endswith(f"; stopped early after {done} requests") for c in table[small])
    assert f"<tr class='early'><td>{small}</td>" in text
    assert f"Left out of the plots and the importances: trial {small} (after {done}" in text
    assert verdict[number] == "not_measured" and "FAIL(unplaceable)" in table[number]
    assert set(verdict.values()) <= set(VERDICTS)
    # where the time went: the measured load over the wall time, computed here from the rows
    ends = trials["started_at"] + pd.to_timedelta(trials["trial_s"].fillna(0), unit="s")
    wall = (ends.max() - trials["started_at"].min()).total_seconds()
    spent = text[text.index("<h2>Where the time went</h2>"):]
    assert f"Efficiency: {100 * trials['bench_s'].sum() / wall:.1f}% of the wall time" in spent
    assert "start-up: API ready" in spent

    result = check_report(out, min_plots=3)  # the trial table reachable at 1400 px
    assert result.title == f"vllm-sweep report: {NAME}"
    assert result.table["viewport"] == 1400
    assert {"output_throughput (tok/s)", "P99 TTFT (ms)", "P99 TPOT (ms)",
            "request_throughput (req/s)"} <= set(result.table["headers"])
    assert result.axis_titles.count("output_throughput (tok/s)") >= 3  # 2 Pareto, 1 effects


@pytest.mark.timeout(300)
def test_report_without_feasible_or_completed_trials_is_sentences(fake_sweep, tmp_path):
    trials = fake_sweep.store.read_trials()
    infeasible = trials.assign(feasible=trials["feasible"].map(lambda v: False if v else v))
    out = render_report(infeasible, fake_sweep.spec, None, tmp_path / "infeasible.html")
    text = out.read_text(encoding="utf-8")
    assert "No feasible configuration: no configuration met the SLA." in text  # the verdict
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
    """`vllm-sweep report` in-process (its entry point as a child: tests/unit/test_cli.py)."""
    res = cli_in_process("report", str(fake_sweep.sweep))
    assert res.returncode == 0, res.stderr
    expected = fake_sweep.store.sweep_dir / "report.html"
    assert res.stdout.strip() == str(expected) and expected.is_file()
    target = tmp_path / "sub" / "mine.html"
    res = cli_in_process("report", str(fake_sweep.sweep), "--out", str(target))
    assert res.returncode == 0 and res.stdout.strip() == str(target) and target.is_file()
