"""The quality probe's pure parts: token agreement and logprob MAD (values by hand), the rule
that judges a trial against the baseline's noise floor, which flags change outputs, and
`min_token_agreement` as an SLA lower bound (spec, objective, rows)."""

from __future__ import annotations

from datetime import UTC
from datetime import datetime
from pathlib import Path

import pytest

from framework.base.errors import ConfigError
from framework.base.vocabulary import limit_text
from framework.base.vocabulary import load_limits
from framework.config.search_space import SearchSpace
from framework.config.specs import load_sweep
from framework.engine.output_flags import output_changes
from framework.load.probe import ProbeAnswer
from framework.results.rows import QUALITY_COLUMNS
from framework.results.rows import TrialContext
from framework.results.rows import trial_columns
from framework.results.rows import trial_row
from framework.trial.objective import evaluate
from framework.trial.objective import evaluate_repeated
from framework.trial.quality import Agreement
from framework.trial.quality import common_prefix
from framework.trial.quality import compare
from framework.trial.quality import judge
from framework.trial.quality import required_agreement
from framework.trial.quality import sla_terms
from framework.trial.quality import unknown
from framework.trial.run import TrialOutcome


def answer(ids: list[int], logprobs: list[float] | None = None) -> ProbeAnswer:
    return ProbeAnswer(tuple(ids), tuple(logprobs if logprobs is not None else [-1.0] * len(ids)))


@pytest.mark.parametrize(("a", "b", "expected"), [
    ([1, 2, 3], [1, 2, 3], 3),
    ([1, 2, 3], [1, 9, 3], 1),  # a later match after the divergence does not count
    ([7, 2, 3], [1, 2, 3], 0),
    ([1, 2], [1, 2, 3], 2),
    ([], [1], 0),
])
def test_common_prefix(a, b, expected):
    assert common_prefix(a, b) == expected


def test_agreement_is_the_shared_prefix_over_all_tokens_and_mad_over_that_prefix():
    reference = [answer([1, 2, 3, 4], [-1.0, -2.0, -3.0, -4.0]),
                 answer([5, 6, 7, 8], [-1.0, -1.0, -1.0, -1.0])]
    other = [answer([1, 2, 9, 4], [-1.5, -2.0, -9.0, -4.0]),  # diverges at position 2
             answer([5, 6, 7, 8], [-1.0, -1.25, -1.0, -1.0])]  # identical tokens
    got = compare(reference, other)
    # shared: 2 + 4 = 6 of 8 tokens; |deltas| over those 6: 0.5, 0, 0, 0.25, 0, 0
    assert got == Agreement(token_agreement=6 / 8, logprob_mad=pytest.approx(0.75 / 6),
                            positions=8, shared=6)


def test_identical_runs_agree_fully_with_zero_mad():
    run = [answer([3, 1, 4, 1, 5], [-0.1, -0.2, -0.3, -0.4, -0.5])]
    assert compare(run, run) == Agreement(1.0, 0.0, 5, 5)


def test_no_shared_position_has_no_mad_and_a_short_answer_lowers_the_agreement():
    assert compare([answer([1, 2])], [answer([2, 1])]) == Agreement(0.0, None, 2, 0)
    # a cut-short answer: its prompt counts the longer length (4), 2 shared
    assert compare([answer([1, 2, 3, 4])], [answer([1, 2])]).token_agreement == 0.5


@pytest.mark.parametrize(("reference", "other", "match"), [
    ([answer([1])], [], "1 reference answers but 0"),
    ([answer([])], [answer([])], "no generated tokens"),
])
def test_compare_refuses_what_cannot_be_compared(reference, other, match):
    with pytest.raises(ValueError, match=match):
        compare(reference, other)


@pytest.mark.parametrize(("itself", "sla", "expected"), [
    (1.0, None, 0.98),    # no SLA: the noise floor, self-agreement - 0.02
    (1.0, 0.95, 0.95),    # the SLA's bar when the baseline clears it
    (0.90, 0.95, 0.88),   # a noisy baseline lowers the bar to its floor
    (0.96, 0.95, 0.94),
])
def test_required_agreement(itself, sla, expected):
    assert required_agreement(itself, sla) == pytest.approx(expected)


@pytest.mark.parametrize(("agreement", "itself", "sla", "ok"), [
    (0.334, 1.0, 0.95, False),   # fp8 KV cache on the tiny model (docs/BENCHMARKS.md)
    (1.0, 1.0, 0.95, True),      # max-num-seqs: outputs unchanged
    (0.95, 1.0, 0.95, True),     # at the bar passes
    (0.97, 1.0, None, False),    # without an SLA: 0.97 < 1.0 - 0.02
    (0.89, 0.90, 0.95, True),    # within the noisy baseline's own floor (0.88)
])
def test_judge(agreement, itself, sla, ok):
    verdict = judge(Agreement(agreement, 0.01, 100, 0), Agreement(itself, 0.0, 100, 0), sla)
    assert verdict.ok is ok
    assert (verdict.token_agreement, verdict.baseline_agreement) == (agreement, itself)
    assert (verdict.logprob_mad, verdict.baseline_logprob_mad) == (0.01, 0.0)
    assert verdict.ok == (agreement >= verdict.required)


@pytest.mark.parametrize(("sla", "verdict", "limits", "judged"), [
    pytest.param({"p99_ttft_ms": 500}, None, {"p99_ttft_ms": 500}, {}, id="no-quality-key"),
    pytest.param({"min_token_agreement": 0.95}, None, {"min_token_agreement": 0.95},
                 {"min_token_agreement": 1.0}, id="not-probed-counts-as-1"),
    pytest.param({"min_token_agreement": 0.95},
                 judge(Agreement(0.5, None, 10, 5), Agreement(0.9, 0.0, 10, 9), 0.95),
                 {"min_token_agreement": pytest.approx(0.88)}, {"min_token_agreement": 0.5},
                 id="probed-against-the-bar-applied"),
    pytest.param({"min_token_agreement": 0.95}, unknown("no baseline"),
                 {"min_token_agreement": 0.95}, {"min_token_agreement": 0.0},
                 id="unknown-fails"),
])
def test_sla_terms(sla, verdict, limits, judged):
    assert sla_terms(sla, verdict) == (limits, judged)


def test_min_token_agreement_is_a_lower_bound_in_the_verdict():
    metrics = {"completed": 10, "failed": 0, "output_throughput": 100.0, "p99_ttft_ms": 50.0}
    sla = {"p99_ttft_ms": 100.0, "min_token_agreement": 0.95}
    bad = evaluate(metrics, sla, "output_throughput", judged={"min_token_agreement": 0.334})
    assert not bad.feasible and bad.violations == ("min_token_agreement 33.4% < 95% (-62 points)",)
    assert bad.constraints["min_token_agreement"] == pytest.approx(0.95 - 0.334)  # a fraction
    assert bad.constraints["p99_ttft_ms"] == pytest.approx(-0.5)
    good = evaluate(metrics, sla, "output_throughput", judged={"min_token_agreement": 0.95})
    assert good.feasible and good.constraints["min_token_agreement"] == 0.0


def test_repeated_runs_take_the_agreement_as_given_and_no_interval_for_it():
    runs = [{"completed": 10, "failed": 0, "output_throughput": t, "p99_ttft_ms": 50.0}
            for t in (90.0, 110.0)]
    sla = {"p99_ttft_ms": 100.0, "min_token_agreement": 0.95}
    verdict, extra = evaluate_repeated(runs, sla, "output_throughput",
                                       judged={"min_token_agreement": 0.5})
    assert verdict.violations == ("min_token_agreement 50% < 95% (-45 points)",)
    assert "p99_ttft_ms_ci95_high" in extra and "min_token_agreement_ci95_high" not in extra


def test_limit_text_and_load_limits():
    sla = {"p99_ttft_ms": 500.0, "min_token_agreement": 0.95, "error_rate": 0.01}
    assert [limit_text(k, v) for k, v in sla.items()] == [
        "p99_ttft_ms <= 500 ms", "min_token_agreement >= 95%", "error_rate <= 1%"]
    assert load_limits(sla) == {"p99_ttft_ms": 500.0, "error_rate": 0.01}


BASELINE = {"enforce-eager": True, "max-model-len": 512}


@pytest.mark.parametrize(("flags", "baseline", "declared", "expected"), [
    pytest.param({**BASELINE, "max-num-seqs": 4}, BASELINE, {}, (), id="batching-only"),
    pytest.param({**BASELINE, "kv-cache-dtype": "fp8"}, BASELINE, {}, ("kv-cache-dtype",),
                 id="fp8-kv-cache"),
    pytest.param({**BASELINE, "kv-cache-dtype": "auto"}, BASELINE, {}, (), id="auto-is-neutral"),
    pytest.param({"kv-cache-dtype": "fp8"}, {"kv-cache-dtype": "fp8"}, {}, (),
                 id="fixed-for-all-trials"),
    pytest.param({"kv-cache-dtype": "auto"}, {"kv-cache-dtype": "fp8"}, {}, ("kv-cache-dtype",),
                 id="back-to-auto-from-a-fixed-fp8"),
    pytest.param({"quantization": "fp8", "dtype": "float16"}, {}, {}, ("quantization", "dtype"),
                 id="quantization-and-dtype"),
    pytest.param({"speculative-config": '{"method": "ngram"}', "spec-tokens": 3}, {}, {},
                 ("speculative-config", "spec-tokens"), id="speculative-decoding"),
    pytest.param({"my-lossy-flag": 3}, {}, {"my-lossy-flag": 1}, ("my-lossy-flag",),
                 id="declared-lossy-off-its-default"),
    pytest.param({"my-lossy-flag": 1}, {}, {"my-lossy-flag": 1}, (), id="declared-at-default"),
    pytest.param({"my-lossy-flag": "1"}, {}, {"my-lossy-flag": 1}, (), id="compared-as-text"),
])
def test_output_changes(flags, baseline, declared, expected):
    assert output_changes(flags, baseline, declared) == expected


def test_lossy_is_a_server_parameter_attribute():
    space = SearchSpace.model_validate({"parameters": {
        "max-num-seqs": {"type": "int", "low": 2, "high": 8, "default": 8},
        "kv-cache-dtype": {"type": "categorical", "choices": ["auto", "fp8"], "default": "auto",
                           "lossy": True}}})
    assert [p.lossy for p in space.parameters.values()] == [False, True]
    with pytest.raises(ValueError, match="lossy: true is for vLLM flags"):
        SearchSpace.model_validate({"parameters": {"max-concurrency": {
            "type": "int", "low": 1, "high": 4, "default": 4, "kind": "run", "lossy": True}}})


def sweep_file(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text("name: q\nmodel: m\nsearch_space: s\n" + extra)
    return path


@pytest.mark.parametrize(("extra", "key", "mentions"), [
    ("sla: {min_token_agreement: 0}\n", "sla", "(0, 1]"),
    ("sla: {min_token_agreement: 1.5}\n", "sla", "(0, 1]"),
    ("sla: {min_token_agreement: 0.95}\nsearch: {baseline: false}\n", "(top level)",
     "needs search.baseline: true"),
    ("sla: {min_token_agreement: 0.95}\ncapacity: {}\n", "(top level)",
     "needs an sla on the load"),
])
def test_min_token_agreement_in_a_sweep_file_is_checked(tmp_path, extra, key, mentions):
    path = sweep_file(tmp_path, extra)
    with pytest.raises(ConfigError) as info:
        load_sweep(path)
    assert info.value.key == key and mentions in str(info.value)
    assert "\n" not in str(info.value)


def test_min_token_agreement_accepted_next_to_load_limits(tmp_path):
    spec = load_sweep(sweep_file(tmp_path, "sla: {p99_ttft_ms: 500, min_token_agreement: 0.95}\n"))
    assert spec.sla == {"p99_ttft_ms": 500, "min_token_agreement": 0.95}


def test_quality_columns_in_the_trial_row():
    space = SearchSpace.model_validate({"parameters": {
        "kv-cache-dtype": {"type": "categorical", "choices": ["auto", "fp8"], "default": "auto"}}})
    columns = trial_columns(space, (50, 99), ["p99_ttft_ms", "min_token_agreement"])
    names = [name for name, _ in columns]
    assert set(QUALITY_COLUMNS) <= set(columns)
    assert "p99_ttft_ms_ci95_high" in names and "min_token_agreement_ci95_high" not in names
    verdict = judge(Agreement(0.334, 0.0087, 512, 171), Agreement(1.0, 0.0, 512, 512), 0.95,
                    note="changes kv-cache-dtype")
    ctx = TrialContext(number=3, params={"kv-cache-dtype": "fp8"}, is_baseline=False,
                       serve_command="vllm serve m", vllm_version="0.32", server_log="x.log")
    row = trial_row(ctx, TrialOutcome(started_at=datetime.now(UTC), argv=(), quality=verdict),
                    None, columns)
    assert {k: row[k] for k, _ in QUALITY_COLUMNS} == {
        "token_agreement": 0.334, "logprob_mad": 0.0087, "quality_baseline_agreement": 1.0,
        "quality_baseline_logprob_mad": 0.0, "quality_required": 0.95, "quality_ok": False,
        "quality_note": "changes kv-cache-dtype"}
    unprobed = trial_row(ctx, TrialOutcome(started_at=datetime.now(UTC), argv=()), None, columns)
    assert all(unprobed[k] is None for k, _ in QUALITY_COLUMNS)



def test_the_report_and_the_summary_show_the_quality_numbers(tmp_path):
    """Rows written as Parquet and read back as the report reads them: probed trials in the
    quality table with their verdicts, the unprobed one left out; the SLA's lower bound reads
    '>=' in the summary."""
    from rich.console import Console

    from framework.results.console import print_summary
    from framework.results.quality_report import quality_section
    from framework.results.store import ResultStore
    from framework.trial.objective import Verdict

    space = SearchSpace.model_validate({"parameters": {
        "kv-cache-dtype": {"type": "categorical", "choices": ["auto", "fp8"], "default": "auto"},
        "max-num-seqs": {"type": "int", "low": 2, "high": 128, "default": 128}}})
    sla = {"min_token_agreement": 0.95}
    columns = trial_columns(space, (50, 99), list(sla))
    itself = Agreement(1.0, 0.0, 512, 512)
    cases = [
        (0, True, {"kv-cache-dtype": "auto", "max-num-seqs": 128},
         judge(itself, itself, 0.95, note="the baseline: <its> runs")),
        (1, False, {"kv-cache-dtype": "fp8", "max-num-seqs": 128},
         judge(Agreement(0.334, 0.0087, 512, 171), itself, 0.95, note="changes kv-cache-dtype")),
        (2, False, {"kv-cache-dtype": "auto", "max-num-seqs": 4}, None),
    ]
    store = ResultStore(tmp_path, "q")
    for number, baseline, params, quality in cases:
        ctx = TrialContext(number=number, params=params, is_baseline=baseline,
                           serve_command="vllm serve m", vllm_version="0.32", server_log="x")
        outcome = TrialOutcome(started_at=datetime.now(UTC), argv=(), quality=quality,
                               metrics={"completed": 10, "failed": 0, "output_throughput": 5.0})
        feasible = quality is None or bool(quality.ok)
        verdict = Verdict(objective=5.0 + number, feasible=feasible, constraints={},
                          violations=() if feasible else ("min_token_agreement 0.334 < 0.95",))
        store.write_trial(trial_row(ctx, outcome, verdict, columns), columns)
    trials = store.read_trials()

    section = quality_section(trials)
    assert section.count("<tr>") == 3  # the header and the two probed trials
    assert "&lt;its&gt;" in section and "<its>" not in section
    assert "<td class='n'>33.4%</td>" in section and "<td class='fail'>outputs changed</td>" in section
    assert "<td class='ok'>holds</td>" in section and "<td>0*</td>" in section

    console = Console(record=True, width=200)
    print_summary(console, trials, list(space.parameters), "output_throughput", True, sla)
    text = console.export_text()
    assert "min_token_agreement >= 95%" in text and "token_agreement" in text
