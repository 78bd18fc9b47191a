"""Sweep files -> SweepSpec: the shipped example, a catalogue of malformed files, metric names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from framework.base.errors import ConfigError
from framework.base.vocabulary import is_latency_metric
from framework.config.search_space import load_search_space
from framework.config.specs import SearchSpec
from framework.config.specs import SweepSpec
from framework.config.specs import load_sweep
from tests.paths import ROOT as REPO

# Smallest valid sweep; every malformed case below starts from it.
BASE = "name: t\nmodel: models/m\nsearch_space: spaces/s.yaml\n"


def _file_value_reached(where: str, got: object, value: object) -> None:
    """One value of the file as its spec field holds it: a path as a Path, fixed server args
    in file order (they are emitted as flags in that order), sampling as its set fields."""
    if isinstance(got, Path):
        assert got == Path(value), where
    elif hasattr(got, "set_fields"):
        assert got.set_fields() == value, where
    elif isinstance(got, dict):
        assert list(got.items()) == list(value.items()), where
    else:
        assert got == value, where  # YAML's `.inf` is math.inf: equal to itself


def test_quickstart_loads_with_its_values():
    """Every value the quickstart file states reaches the spec field of its key. The file is read
    here as plain YAML, so the test follows the file: it checks the loader, not a copy of it."""
    path = REPO / "sweeps" / "quickstart.yaml"
    raw = yaml.safe_load(path.read_text())
    spec = load_sweep(path)

    sections = {"server", "workload", "objective", "search", "cluster"}  # `sla` is a plain dict
    assert sections <= raw.keys()
    for key, value in raw.items():
        if key in sections:
            for field, inner in value.items():
                _file_value_reached(f"{key}.{field}", getattr(getattr(spec, key), field), inner)
        else:
            _file_value_reached(key, getattr(spec, key), value)

    # what the file leaves out: the defaults, and what the loader derives from the file's values
    assert "host" not in raw["server"] and spec.server.host == "auto"
    assert "percentiles" not in raw["workload"]
    assert spec.workload.percentiles == (25, 50, 75, 90, 95, 99)
    for key in spec.sla:  # the default percentiles cover the file's percentile SLA keys
        if match := re.match(r"p(\d+)_", key):
            assert float(match[1]) in spec.workload.percentiles, key
    s = spec.search
    assert "repeats" not in raw["search"] and s.repeats == 1
    # with `precision` set a trial may need up to precision_max_runs runs, else `repeats`
    assert s.max_runs == (raw["search"]["precision_max_runs"]
                          if raw["search"].get("precision") is not None else s.repeats)
    # startup_trials not given: n_trials // 3 clamped to [2, 10]
    assert "startup_trials" not in raw["search"] and s.startup_trials is None
    assert s.effective_startup_trials == max(2, min(10, raw["search"]["n_trials"] // 3))
    assert "address" not in raw["cluster"] and spec.cluster.address is None


def test_spec_is_frozen():
    spec = load_sweep(REPO / "sweeps" / "quickstart.yaml")
    with pytest.raises(ValidationError):
        spec.name = "other"


def test_minimal_sweep_gets_defaults(tmp_path):
    path = tmp_path / "min.yaml"
    path.write_text(BASE)
    spec = load_sweep(path)
    assert spec.name == "t"
    assert spec.engine == "cpu"
    assert spec.sla == {}
    assert spec.server.args == {}
    assert spec.workload.num_prompts == 200
    assert spec.objective.metric == "output_throughput"


def test_sla_percentile_key_accepted_when_percentile_listed(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text(BASE + "workload: {percentiles: [50, 99.9]}\n"
                           "sla: {p99.9_itl_ms: 40, error_rate: 0}\n"
                           "objective: {metric: p50_ttft_ms, direction: minimize}\n")
    spec = load_sweep(path)
    assert spec.sla == {"p99.9_itl_ms": 40, "error_rate": 0}  # error_rate may be 0
    assert spec.workload.percentiles == (50, 99.9)


# (id, file text, expected ConfigError.key, substrings the one-line message must contain)
MALFORMED = [
    ("unknown-top-level-key", BASE + "colour: red\n", "colour", ()),
    ("unknown-nested-key", BASE + "workload: {num_promts: 5}\n", "workload.num_promts", ()),
    ("unknown-search-key", BASE + "search: {trials: 5}\n", "search.trials", ()),
    ("precision-one", BASE + "search: {precision: 1}\n", "search.precision", ()),
    ("precision-zero", BASE + "search: {precision: 0}\n", "search.precision", ()),
    ("repeats-over-precision-cap", BASE + "search: {precision: 0.05, repeats: 4, "
     "precision_max_runs: 3}\n", "search", ("repeats 4 > precision_max_runs 3",)),
    ("baseline-repeats-negative", BASE + "search: {baseline_repeats: -1}\n",
     "search.baseline_repeats", ()),
    ("precision-in-capacity-mode", BASE + "sla: {p99_ttft_ms: 500}\ncapacity: {}\n"
     "search: {precision: 0.05}\n", "(top level)", ("search.precision",)),
    ("wrong-type-int", BASE + "workload: {num_prompts: many}\n", "workload.num_prompts",
     ("'many'",)),
    ("wrong-type-section", BASE + "workload: 5\n", "workload", ()),
    ("negative-num-prompts", BASE + "workload: {num_prompts: -5}\n", "workload.num_prompts",
     ("-5",)),
    ("zero-num-prompts", BASE + "workload: {num_prompts: 0}\n", "workload.num_prompts", ()),
    ("request-rate-zero", BASE + "workload: {request_rate: 0}\n", "workload.request_rate", ()),
    ("request-rate-negative", BASE + "workload: {request_rate: -2.5}\n",
     "workload.request_rate", ("-2.5",)),
    ("range-ratio-one", BASE + "workload: {range_ratio: 1}\n", "workload.range_ratio", ()),
    ("percentile-zero", BASE + "workload: {percentiles: [50, 0]}\n", "workload.percentiles",
     ("percentile 0",)),
    ("percentile-101", BASE + "workload: {percentiles: [101]}\n", "workload.percentiles",
     ("percentile 101",)),
    ("sla-unknown-metric", BASE + "sla: {p99_latency_ms: 5}\n", "sla", ("p99_latency_ms",)),
    ("sla-throughput-metric", BASE + "sla: {output_throughput: 5}\n", "sla",
     ("output_throughput",)),
    ("sla-limit-zero", BASE + "sla: {p99_ttft_ms: 0}\n", "sla", ("p99_ttft_ms", "> 0")),
    ("sla-limit-negative", BASE + "sla: {p99_tpot_ms: -3}\n", "sla", ("p99_tpot_ms", "-3")),
    ("sla-limit-not-number", BASE + "sla: {p99_ttft_ms: fast}\n", "sla.p99_ttft_ms", ("'fast'",)),
    ("objective-unknown-metric", BASE + "objective: {metric: goodness}\n", "objective.metric",
     ("goodness",)),
    ("objective-p0", BASE + "objective: {metric: p0_ttft_ms}\n", "objective.metric",
     ("p0_ttft_ms",)),
    ("objective-bad-direction", BASE + "objective: {direction: up}\n", "objective.direction", ()),
    ("yaml-syntax-error", "name: t\nmodel: m: x\n", "line 2", ("YAML syntax error",)),
    ("yaml-unclosed-flow", "name: t\nmodel: m\nsla: {p99_ttft_ms: 5\n", None, ("YAML syntax error",)),
    ("top-level-list", "- name\n- t\n", "(top level)", ("list", "expected a mapping")),
    ("top-level-scalar", "just a string\n", "(top level)", ("str", "expected a mapping")),
    ("empty-file", "", "(top level)", ("NoneType",)),
    ("server-args-leading-dashes", BASE + "server: {args: {--max-model-len: 512}}\n", "server.args",
     ("--max-model-len", "without leading dashes")),
    ("server-args-single-dash", BASE + "server: {args: {-O: 3}}\n", "server.args", ("-O",)),
    ("server-args-sets-port", BASE + "server: {args: {port: 9000}}\n", "server.args", ("'port'",)),
    ("server-args-list-value", BASE + "server: {args: {max-model-len: [1, 2]}}\n",
     "server.args.max-model-len", ()),
    ("server-startup-timeout-zero", BASE + "server: {startup_timeout_s: 0}\n",
     "server.startup_timeout_s", ()),
    ("sla-p99.9-without-percentile", BASE + "sla: {p99.9_ttft_ms: 5}\n", "(top level)",
     ("p99.9_ttft_ms", "99.9", "workload.percentiles")),
    ("objective-percentile-not-listed",
     BASE + "workload: {percentiles: [50, 99]}\nobjective: {metric: p95_tpot_ms, direction: minimize}\n",
     "(top level)", ("p95_tpot_ms", "workload.percentiles")),
    ("name-with-space", "name: my sweep\nmodel: m\nsearch_space: s\n", "name", ("'my sweep'",)),
    ("name-leading-dash", "name: -x\nmodel: m\nsearch_space: s\n", "name", ("'-x'",)),
    ("name-slash", "name: a/b\nmodel: m\nsearch_space: s\n", "name", ("'a/b'",)),
    ("name-too-long", f"name: {'a' * 65}\nmodel: m\nsearch_space: s\n", "name", ()),
    ("name-missing", "model: m\nsearch_space: s\n", "name", ("Field required",)),
    ("engine-unknown", BASE + "engine: tpu\n", "engine", ("'tpu'",)),
    ("sampler-unknown", BASE + "search: {sampler: cmaes}\n", "search.sampler", ("'cmaes'",)),
    ("n-trials-zero", BASE + "search: {n_trials: 0}\n", "search.n_trials", ()),
    ("startup-trials-negative", BASE + "search: {startup_trials: -1}\n", "search.startup_trials", ()),
    ("cpus-per-worker-zero", BASE + "cluster: {cpus_per_worker: 0}\n", "cluster.cpus_per_worker", ()),
]


@pytest.mark.parametrize(("text", "key", "mentions"), [c[1:] for c in MALFORMED],
                         ids=[c[0] for c in MALFORMED])
def test_malformed_sweep_is_one_line_config_error(tmp_path, text, key, mentions):
    path = tmp_path / "bad sweep.yaml"  # a space in the path must survive too
    path.write_text(text)

    with pytest.raises(ConfigError) as info:
        load_sweep(path)

    err = info.value
    message = str(err)
    assert "\n" not in message and "\r" not in message
    assert message.startswith(f"{path}: ")
    assert err.file == str(path)
    if key is not None:
        # a union member may add its tag after the key (server.args.<flag>.<type>)
        assert err.key == key or err.key.startswith(key + ".")
        assert f": {err.key}: " in message
    else:
        assert err.key.startswith("line ")
    for text_part in mentions:
        assert text_part in message


@pytest.mark.parametrize("load", [load_sweep, load_search_space])
def test_a_missing_file_is_one_config_error(tmp_path, load):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="No such file") as info:
        load(path)
    assert info.value.key == "(file)"
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_yaml_error_line_is_one_based(tmp_path):
    path = tmp_path / "s.yaml"
    # lines 1-3 are fine; line 4 has a second ':' in a plain scalar mapping value
    path.write_text(BASE + "engine: cpu: gpu\n")
    with pytest.raises(ConfigError) as info:
        load_sweep(path)
    assert info.value.key == "line 4"


def test_sla_key_with_seven_digit_percentile_accepted(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(BASE + "workload: {percentiles: [99.99999]}\nsla: {p99.99999_ttft_ms: 5}\n")
    assert load_sweep(path).sla == {"p99.99999_ttft_ms": 5}


def test_sla_key_for_unlisted_percentile_rejected_even_if_rounding_matches(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(BASE + "workload: {percentiles: [99.99999]}\nsla: {p100_ttft_ms: 5}\n")
    with pytest.raises(ConfigError):
        load_sweep(path)


def test_negative_error_rate_limit_rejected(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(BASE + "sla: {error_rate: -0.5}\n")
    with pytest.raises(ConfigError) as info:
        load_sweep(path)
    assert "error_rate" in str(info.value)


@pytest.mark.parametrize(("key", "expected"), [
    ("p99_ttft_ms", True),
    ("p50_tpot_ms", True),
    ("p99.9_itl_ms", True),
    ("p100_e2el_ms", True),
    ("p0.5_ttft_ms", True),
    ("mean_tpot_ms", True),
    ("median_itl_ms", True),
    ("std_e2el_ms", True),
    ("p0_ttft_ms", False),       # percentile must be > 0
    ("p101_ttft_ms", False),     # and <= 100
    ("p100.1_ttft_ms", False),
    ("p_ttft_ms", False),
    ("p99_latency_ms", False),   # unknown latency metric
    ("max_ttft_ms", False),      # unknown statistic
    ("p99_ttft", False),         # unit missing
    ("p99_ttft_s", False),
    ("P99_ttft_ms", False),      # case matters
    ("p99_ttft_ms_x", False),
    ("xp99_ttft_ms", False),
    ("output_throughput", False),
    ("error_rate", False),
    ("", False),
])
def test_is_latency_metric(key, expected):
    assert is_latency_metric(key) is expected


@pytest.mark.parametrize(("n_trials", "startup_trials", "expected"), [
    (1, None, 2),      # 0 -> clamped up to 2
    (6, None, 2),
    (8, None, 2),
    (9, None, 3),
    (10, None, 3),
    (30, None, 10),
    (33, None, 10),    # 11 -> clamped down to 10
    (1000, None, 10),
    (10, 0, 0),        # given value wins, even 0
    (10, 7, 7),
    (1000, 25, 25),
])
def test_effective_startup_trials(n_trials, startup_trials, expected):
    spec = SearchSpec(n_trials=n_trials, startup_trials=startup_trials)
    assert spec.effective_startup_trials == expected


SECRET = "sk-not-for-files-12345"


@pytest.mark.parametrize(("server", "key"), [
    ("{args: {api-key: %s}}", "server.args.api-key"),
    ("{args: {api_key: %s}}", "server.args.api_key"),
    ("{args: {--api-key: %s}}", "server.args.--api-key"),
    ("{args: {max-model-len: 512, API-KEY: %s}}", "server.args.API-KEY"),
    ("{args: {api-key: [%s]}}", "server.args.api-key"),  # rejected before any type check
    ("{env: {VLLM_API_KEY: %s}}", "server.env.VLLM_API_KEY"),
    ("{env: {HF_HUB_OFFLINE: '1', vllm_api_key: %s}}", "server.env.vllm_api_key"),
])
def test_an_api_key_in_the_sweep_file_is_rejected_without_showing_it(tmp_path, server, key):
    path = tmp_path / "s.yaml"
    path.write_text(BASE + f"server: {server % SECRET}\n")
    with pytest.raises(ConfigError, match=r"server\.api_key_env$") as info:
        load_sweep(path)
    message = str(info.value)
    assert message.startswith(f"{path}: {key}: '<hidden>': an API key does not belong in the "
                              "sweep file")
    assert SECRET not in message and "\n" not in message
    assert (info.value.key, info.value.value) == (key, "<hidden>")


@pytest.mark.parametrize("server", ["{args: {api-key-file: k.txt}}", "{env: {API_KEY_PATH: x}}",
                                    "{api_key_env: VLLM_KEY}"])  # MY_API_KEY: test_secret_names
def test_names_near_an_api_key_are_not_rejected(tmp_path, server):
    path = tmp_path / "s.yaml"
    path.write_text(BASE + f"server: {server}\n")
    load_sweep(path)


def test_an_api_key_is_no_search_parameter(tmp_path, tiny_model, name="api-key"):
    from framework.sweep import loader as sweep_mod

    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        name: {"type": "categorical", "choices": ["s3cret-a", "s3cret-b"]}}}))
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "k", "model": str(tiny_model), "search_space": str(space),
                                    "search": {"baseline": False}}))
    with pytest.raises(ConfigError, match=r"parameters\..*<hidden>.*server\.api_key_env") as err:
        sweep_mod.load(path, check_flags=False)
    assert "s3cret" not in str(err.value)


def test_an_unknown_gpu_is_one_line_naming_the_known_ones(tmp_path, tiny_model):
    from framework.sweep import loader as sweep_mod

    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "g", "model": str(tiny_model), "gpu": "A100-96GB",
                                    "search_space": str(REPO / "search_spaces" / "tiny_cpu.yaml")}))
    with pytest.raises(ConfigError, match=r"gpu: 'A100-96GB': unknown GPU; known: .*A100-80GB") as err:
        sweep_mod.load(path, check_flags=False)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("engine, search, sampler", [
    ("gpu", {}, "gp"),  # benchmarks/search_quality.py: GP before TPE on GPU-scale spaces
    ("gpu", {"prior": "aiconfigurator"}, "tpe"),  # the prior's top k, then TPE, refitted
    ("gpu", {"sampler": "random"}, "random"),  # a given sampler stays
    ("cpu", {}, "tpe"),
    ("fake", {}, "tpe"),
])
def test_the_default_sampler_follows_the_engine_and_the_prior(engine, search, sampler):
    spec = SweepSpec.model_validate({"name": "x", "model": "m", "search_space": "s.yaml",
                                     "engine": engine, "search": search})
    assert spec.search.sampler == sampler
