"""A validated sweep: its spec, its search space and the servers' environment (the load every
trial receives: sweep.trial_load)."""

from __future__ import annotations

import functools
import importlib.util
import ipaddress
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from functools import cached_property
from pathlib import Path

from framework.base.errors import ConfigError
from framework.base.vocabulary import Scalar
from framework.cluster.autoscaling import AutoscalingConfigError
from framework.cluster.autoscaling import read_config
from framework.config.search_space import CategoricalParam
from framework.config.search_space import IntParam
from framework.config.search_space import SearchSpace
from framework.config.search_space import grid_points
from framework.config.search_space import load_search_space
from framework.config.specs import SweepSpec
from framework.config.specs import load_sweep
from framework.engine.feasibility import GPUS
from framework.engine.feasibility import Feasibility
from framework.engine.feasibility import ModelFacts
from framework.engine.feasibility import check
from framework.engine.feasibility import check_cpu
from framework.engine.feasibility import read_model_facts
from framework.engine.model_info import read_model_info
from framework.engine.predictor import PREDICTORS
from framework.fleet.columns import Target
from framework.fleet.prices import Price
from framework.fleet.prices import resolve_price
from framework.results.store import ResultStore
from framework.results.store import open_store
from framework.sweep.cross_checks import check_cross
from framework.sweep.fleet_inputs import check_prices
from framework.sweep.fleet_inputs import file_prices
from framework.sweep.fleet_inputs import target_of
from framework.sweep.job_dir import check_job_paths
from framework.sweep.load_curve import as_load_curve
from framework.sweep.load_curve import curve_setting
from framework.sweep.load_meaning import check_load_bound
from framework.sweep.load_meaning import named_workloads
from framework.sweep.value_checks import check_flag_values
from framework.sweep.value_checks import check_run_settings


@dataclass(frozen=True)
class Sweep:
    """A validated sweep: its spec, its search space, where the sweep file was, the
    model's architecture facts (None for the fake engine without a `gpu`), the load its
    deployment must carry (`target:`; its rate computed once, from a trace if so) and the
    prices of `pricing.file`. `api_key`: the key servers require and every request of ours
    sends (`api_key(spec)` as loaded; `run` and `doctor` put the run's key here, run_api_key),
    never shown."""

    path: Path
    spec: SweepSpec
    space: SearchSpace
    facts: ModelFacts | None = None
    target: Target | None = None
    file_prices: Mapping[str, float] = field(default_factory=dict)
    api_key: str | None = field(default=None, repr=False)
    load_curve: str | None = None  # the searched load setting measured as a curve (load_curve)

    @cached_property
    def store(self) -> ResultStore:
        """The results (results.store.open_store), opened on first use: an object store's
        sweep is downloaded then, once per Sweep."""
        return open_store(self.spec.results_dir, self.spec.name)

    def with_api_key(self, key: str | None) -> Sweep:
        """This sweep with the run's API key, keeping its results store if already opened (an
        object store's staging copy is made and downloaded once per run, not per copy)."""
        new = replace(self, api_key=key)
        if "store" in self.__dict__:  # where functools.cached_property keeps the value
            new.__dict__["store"] = self.__dict__["store"]
        return new

    def price(self, tp: int = 1, pp: int = 1, dp: int = 1) -> Price | None:
        """The price of one replica of TP x PP x DP devices (fleet.prices.resolve_price)."""
        return resolve_price(self.spec.pricing, engine=self.spec.engine, gpu=self.spec.gpu,
                             tp=tp, pp=pp, dp=dp, file_prices=self.file_prices)


def check_capacity_load(path: Path, spec: SweepSpec, space: SearchSpace) -> None:
    """Capacity mode sets the pace itself: a searched request rate or speed-up, or a fixed
    speed_up on any workload, is a ConfigError."""
    for name in ("request-rate", "speed-up"):
        if name in space.run_params:
            raise ConfigError(str(spec.search_space), f"parameters.{name}", "kind: run",
                              f"capacity mode searches the {name.replace('-', ' ')} itself; "
                              "drop this parameter")
    for key, w in named_workloads(spec):
        if w.speed_up != 1.0:
            raise ConfigError(str(path), f"{key}.speed_up", w.speed_up,
                              "capacity mode searches the trace's speed-up itself; drop this key")


def check_autoscaling_config(path: Path, config: Path) -> None:
    """cluster.autoscaling_config names a readable `ray up` config with worker node types."""
    if not config.is_file():
        raise ConfigError(str(path), "cluster.autoscaling_config", str(config), "file not found")
    try:
        read_config(config)
    except AutoscalingConfigError as exc:
        raise ConfigError(str(path), "cluster.autoscaling_config", str(config), str(exc)) from None


def load(path: Path, check_flags: bool = True) -> Sweep:
    """Load and cross-check a sweep and its search space (ConfigError on any problem): files,
    model facts (TP divides the heads), and, with `check_flags` (run, validate, doctor:
    everything checked before anything starts), flag names and every value a flag can take
    against the installed vLLM (value_checks), run settings, the parts against each other
    (cross_checks) and the API key's environment variable; always, an objective that would
    rank the offered load (load_meaning)."""
    spec = load_sweep(path)
    check_job_paths(path, spec, os.environ)
    if not spec.search_space.is_file():
        raise ConfigError(str(path), "search_space", str(spec.search_space), "file not found")
    space = load_search_space(spec.search_space)
    if spec.cluster.autoscaling_config is not None:
        check_autoscaling_config(path, spec.cluster.autoscaling_config)
    if spec.gpu is not None and spec.gpu not in GPUS:
        raise ConfigError(str(path), "gpu", spec.gpu, f"unknown GPU; known: {', '.join(GPUS)}")
    if spec.search.prior is not None and spec.search.prior not in PREDICTORS:
        raise ConfigError(str(path), "search.prior", spec.search.prior,
                          f"unknown predictor; known: {', '.join(PREDICTORS)}")
    if not (spec.model / "config.json").is_file():
        raise ConfigError(str(path), "model", str(spec.model),
                          "no config.json there (for the quickstart model run `make model`)")
    # a load curve's setting needs none: every trial, the baseline too, runs each of its values
    missing = [n for n in space.missing_defaults() if n != curve_setting(spec, space)]
    if spec.search.baseline and missing:
        raise ConfigError(str(spec.search_space), f"parameters.{missing[0]}.default",
                          None, "search.baseline is on, so every parameter needs vLLM's default")
    for name in space.parameters:
        if name in ("model", "host", "port"):
            raise ConfigError(str(spec.search_space), f"parameters.{name}", name,
                              "set by vllm-sweep, cannot be searched")
    key_env = spec.server.api_key_env
    if check_flags and key_env is not None and not os.environ.get(key_env):
        raise ConfigError(str(path), "server.api_key_env", key_env,
                          f"environment variable {key_env} is not set (it holds the servers' API key)")
    for name in spec.server.secret_env if check_flags else ():
        if not os.environ.get(name):
            raise ConfigError(str(path), "server.secret_env", name,
                              f"environment variable {name} is not set (servers get its value)")
    if spec.capacity is not None:
        check_capacity_load(path, spec, space)
    if spec.search.sampler == "grid":
        try:
            grid_points(space)
        except ValueError as exc:
            raise ConfigError(str(path), "search.sampler", "grid", str(exc)) from None
    facts = None
    if spec.engine != "fake" or spec.gpu is not None:
        facts = read_model_facts(spec.model, str(path))
    if spec.engine != "fake":  # FakeEngine serves no model and is no vLLM
        _check_tensor_parallel(path, spec, space)
        if check_flags:
            check_flag_values(path, spec, space)
    if check_flags:
        check_run_settings(spec, space)
    curve = curve_setting(spec, space)
    spec, space = as_load_curve(spec, space)  # a searched load setting: a curve per trial
    if check_flags:
        check_cross(path, spec, space, vllm_rules=spec.engine != "fake")
    prices = file_prices(path, spec)
    check_prices(path, spec, prices)
    target = target_of(path, spec)
    check_load_bound(path, spec, curve)  # plan's too: pure, no vLLM needed (load_meaning)
    return Sweep(path=path, spec=spec, space=space, facts=facts, target=target,
                 file_prices=prices, api_key=api_key(spec), load_curve=curve)


def check_tokenizer(sw: Sweep) -> None:
    """The load is built with tokenizer.json of workload.tokenizer, else of the model folder:
    `run` needs one before anything starts (`validate` only notes its absence: a folder with
    the model's config.json alone is enough to validate a GPU sweep)."""
    folder = sw.spec.workload.tokenizer or sw.spec.model
    if not (folder / "tokenizer.json").is_file():
        key = "workload.tokenizer" if sw.spec.workload.tokenizer else "model"
        raise ConfigError(str(sw.path), key, str(folder), "no tokenizer.json there: the load "
                          "generator tokenizes the prompts with it (set workload.tokenizer to a "
                          "folder with one)")


def feasibility(sw: Sweep, flags: Mapping[str, Scalar | None],
                devices: int | None) -> Feasibility | None:
    """The memory model and static rules for one trial's flags (None when not applicable:
    a GPU sweep without `gpu:`, or the fake engine without one). CPU engine: the KV space is
    VLLM_CPU_KVCACHE_SPACE GiB of the servers' environment."""
    if sw.facts is None:
        return None
    if sw.spec.engine == "cpu":
        kv_gib = float(server_env(sw.spec).get("VLLM_CPU_KVCACHE_SPACE", "4"))
        return check_cpu(sw.facts, kv_gib, flags, devices)
    if sw.spec.gpu is None:
        return None
    return check(sw.facts, GPUS[sw.spec.gpu], flags, devices)


def _tp_values(space: SearchSpace) -> list[int]:
    param = space.parameters.get("tensor-parallel-size")
    if isinstance(param, CategoricalParam):
        return [int(c) for c in param.choices]
    if isinstance(param, IntParam):
        return list(range(param.low, param.high + 1, param.step))
    return []


def _check_tensor_parallel(path: Path, spec: SweepSpec, space: SearchSpace) -> None:
    """Every TP value the sweep can use must shard the model's attention and KV heads."""
    info = read_model_info(spec.model, str(path))
    fixed = spec.server.args.get("tensor-parallel-size")
    if fixed is not None and (problem := info.tp_problem(int(fixed))):
        raise ConfigError(str(path), "server.args.tensor-parallel-size", fixed, problem)
    for tp in _tp_values(space):
        if problem := info.tp_problem(tp):
            raise ConfigError(str(spec.search_space), "parameters.tensor-parallel-size", tp, problem)


CACHE_DIR_VAR = "VLLM_SWEEP_CACHE_DIR"


def cache_dir(spec: SweepSpec, local: bool = True) -> str:
    """The servers' node-local cache directory (vLLM's compile cache, Hugging Face's files),
    kept across jobs: `cluster.cache_dir`, else $VLLM_SWEEP_CACHE_DIR, else `.cache` of the
    working directory on a private local Ray (`local`) and `~/.cache/vllm-sweep` on a joined
    cluster, where a job's working directory is temporary. A leading `~` is left for each
    node to expand (the server actor does)."""
    chosen = spec.cluster.cache_dir or os.environ.get(CACHE_DIR_VAR)
    if chosen:
        return chosen if chosen.startswith("~") else str(Path(chosen).resolve())
    return str(Path(".cache").resolve()) if local else "~/.cache/vllm-sweep"


LOADER_PACKAGES = ("fastsafetensors",)  # optional loaders the load_format lever may pick


@functools.cache
def installed_loaders() -> frozenset[str]:
    """The optional weight-loader packages importable by the driver (the nodes are taken to run
    the driver's image, as `ray job submit` does)."""
    return frozenset(n for n in LOADER_PACKAGES if importlib.util.find_spec(n) is not None)


def has_safetensors(model: Path) -> bool:
    return model.is_dir() and any(model.glob("*.safetensors"))


def read_ahead_dir(spec: SweepSpec) -> str | None:
    """The model directory the `page_cache` lever reads ahead on each server's node: on the GPU
    engine, with the lever on, real weights, and a local model directory."""
    if (spec.engine != "gpu" or "page_cache" not in spec.server.startup_levers
            or spec.server.dummy_weights or not spec.model.is_dir()):
        return None
    return str(spec.model.resolve())


def server_env(spec: SweepSpec, local: bool = True) -> dict[str, str]:
    """Environment of every server: offline, caches in `cache_dir`, then the sweep's env.
    VLLM_SWEEP_CACHE_DIR is what the server actor turns into VLLM_CACHE_ROOT and HF_HOME on
    its node."""
    env = {
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1", CACHE_DIR_VAR: cache_dir(spec, local),
    }
    if os.environ.get("RAY_AUTH_MODE"):
        env["RAY_AUTH_MODE"] = os.environ["RAY_AUTH_MODE"]
    if spec.engine == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    env.update(spec.server.env)
    return env


def api_key(spec: SweepSpec) -> str | None:
    """The servers' API key, read from the driver's environment (never from a file)."""
    name = spec.server.api_key_env
    return os.environ.get(name) or None if name else None


LOOPBACK_NAMES = ("localhost",)


def beyond_loopback(host: str) -> bool:
    """Whether servers bound to `host` (a resolved server.host: `node` or an address) can be
    reached from other machines."""
    if host in LOOPBACK_NAMES:
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:  # `node`, or a host name: taken as reachable
        return True


def run_api_key(spec: SweepSpec, local: bool, host: str, no_api_key: bool) -> str | None:
    """The API key of one run's servers: server.api_key_env's, else, when the servers can be
    reached from other machines (a joined cluster, or `host` beyond loopback), a random key of
    this run alone (`--no-api-key`: none), else none."""
    if (given := api_key(spec)) is not None:
        return given
    if no_api_key or (local and not beyond_loopback(host)):
        return None
    return secrets.token_urlsafe(32)


def server_secrets(spec: SweepSpec, key: str | None) -> dict[str, str]:
    """What each server actor gets as its `secret_env` call argument (never its runtime_env):
    the run's API key as VLLM_API_KEY and the driver's server.secret_env variables."""
    found = {name: os.environ[name] for name in spec.server.secret_env if os.environ.get(name)}
    return {**found, **({"VLLM_API_KEY": key} if key else {})}
