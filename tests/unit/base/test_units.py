"""Every number shown has its unit: unit_of, with_unit and label (framework/base/vocabulary.py),
table-tested, and every numeric trial column has the unit docs/RESULTS.md gives it."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from framework.base.vocabulary import DEFAULT_PERCENTILES
from framework.base.vocabulary import label
from framework.base.vocabulary import unit_of
from framework.base.vocabulary import with_unit
from framework.config.search_space import load_search_space
from framework.results.rows import trial_columns
from tests.paths import ROOT


@pytest.mark.parametrize(("column", "unit"), [
    ("p99_ttft_ms", "ms"), ("mean_tpot_ms", "ms"), ("p99.9_itl_ms", "ms"),
    ("p99_ttft_ms_ci95_high", "ms"), ("error_rate_ci95_high", "%"),
    ("startup_s", "s"), ("queue_time_mean_s", "s"), ("duration", "s"),
    ("output_throughput", "tok/s"), ("total_token_throughput", "tok/s"),
    ("output_throughput_per_gpu", "tok/s"), ("max_output_tokens_per_s", "tok/s"),
    ("request_throughput", "req/s"), ("request_goodput", "req/s"), ("capacity_rps", "req/s"),
    ("request_goodput_per_gpu", "req/s"),
    ("error_rate", "%"), ("kv_cache_usage_max", "%"), ("prefix_cache_hit_rate", "%"),
    ("objective_cv", "%"),
    ("total_output_tokens", "tok"), ("est_kv_tokens_capacity", "tok"),
    ("completed", "req"), ("running_requests_max", "req"), ("max_concurrent_requests", "req"),
    ("est_weights_gib_per_gpu", "GiB"),
    ("param_max_num_seqs", ""), ("objective", ""), ("objective_ci95_high", ""),
    ("preemptions", ""), ("trial_number", ""), ("state", ""),
])
def test_unit_of(column, unit):
    assert unit_of(column) == unit


@pytest.mark.parametrize(("column", "value", "text"), [
    ("p99_ttft_ms", 612.345, "612.3 ms"),
    ("p99_ttft_ms", np.float64(612.345), "612.3 ms"),  # what a pandas row holds
    ("output_throughput", 1234.56, "1,235 tok/s"),  # thousands separated, never 1.235e+03
    ("total_output_tokens", 123456, "123,456 tok"),
    ("request_throughput", 12.0, "12 req/s"),
    ("kv_cache_usage_max", 0.4, "40%"),  # a fraction, shown as a percentage
    ("error_rate", 0, "0%"),
    ("prefix_cache_hit_rate", 0.123456, "12.35%"),
    ("completed", np.int64(200), "200 req"),
    ("bench_s", 0.7, "0.7 s"),
    ("param_max_num_seqs", np.int64(8), "8"),
    ("p99_ttft_ms", None, "-"), ("p99_ttft_ms", math.nan, "-"),
    ("state", "COMPLETE", "COMPLETE"), ("param_enable_prefix_caching", True, "True"),
])
def test_with_unit(column, value, text):
    assert with_unit(column, value) == text


@pytest.mark.parametrize(("column", "text"), [
    ("output_throughput", "output_throughput (tok/s)"),
    ("kv_cache_usage_max", "kv_cache_usage_max (%)"),
    ("p99_ttft_ms", "p99_ttft_ms"),  # the name says it already
    ("startup_s", "startup_s"),
    ("param_max_num_seqs", "param_max_num_seqs"),
])
def test_label(column, text):
    assert label(column) == text


# docs/RESULTS.md's unit words -> unit_of's
_DOC_UNITS = {"ms": "ms", "s": "s", "tokens/s": "tok/s", "requests/s": "req/s", "fraction": "%",
              "GiB": "GiB", "tokens": "tok"}


def test_every_documented_unit_is_the_one_shown():
    """The doc's unit of each trial column (a row `| `column` | kind | unit | ...`) is the
    unit the console, status and report show it in (counts may say `req`)."""
    doc = (ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8")
    documented = dict(re.findall(r"^\| `([^`]+)` \| [^|]+ \| ([^|]+?) \|", doc, re.MULTILINE))
    space = load_search_space(ROOT / "search_spaces" / "tiny_cpu.yaml")
    checked = 0
    for column, kind in trial_columns(space, DEFAULT_PERCENTILES, ["p99_ttft_ms"]):
        if kind not in ("int", "float") or column not in documented:
            continue
        doc_unit = documented[column]
        if doc_unit in _DOC_UNITS:
            assert unit_of(column) == _DOC_UNITS[doc_unit], (column, doc_unit)
            checked += 1
        elif doc_unit == "count":
            assert unit_of(column) in ("", "req"), column
        else:
            assert unit_of(column) == "", (column, doc_unit)
    assert checked >= 60  # the latency, throughput, fraction, time and size columns
