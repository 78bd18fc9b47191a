"""Sweep YAML -> frozen, validated `SweepSpec`. Unknown keys are errors.

Relative paths in a sweep file (model, search_space, results_dir) are resolved against the
directory `vllm-sweep` runs from (the repository root for `make demo`, the job's working dir
under Ray jobs: the submitting directory itself for `vllm-sweep submit`; framework/sweep/job_dir.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from typing import Literal

from pydantic import Field
from pydantic import field_validator
from pydantic import model_validator

from framework.base.vocabulary import ERROR_RATE  # noqa: F401 - Scalar and the metric words, re-exported
from framework.base.vocabulary import FLEET_OBJECTIVES
from framework.base.vocabulary import LATENCY_METRICS
from framework.base.vocabulary import MIN_TOKEN_AGREEMENT
from framework.base.vocabulary import THROUGHPUT_METRICS
from framework.base.vocabulary import Scalar
from framework.base.vocabulary import StartupLever
from framework.base.vocabulary import is_latency_metric
from framework.base.vocabulary import load_limits
from framework.base.vocabulary import parse_latency_key
from framework.base.vocabulary import percentile_key
from framework.base.vocabulary import split_class_key
from framework.config import secret_names
from framework.config.cluster_spec import ClusterSpec
from framework.config.results_location import is_store_uri
from framework.config.results_location import uri_problem
from framework.config.search_spec import CapacitySpec
from framework.config.search_spec import Sampler  # noqa: F401 - re-exported
from framework.config.search_spec import SearchSpec
from framework.config.spec_base import NAME as _NAME
from framework.config.spec_base import Spec as _Spec
from framework.config.target_spec import PricingSpec
from framework.config.target_spec import TargetSpec
from framework.config.workload_spec import NamedWorkloadSpec as NamedWorkloadSpec  # re-exported
from framework.config.workload_spec import WorkloadSpec as WorkloadSpec  # re-exported
from framework.config.workloads_spec import first_workload
from framework.config.workloads_spec import workloads_problem
from framework.config.yaml_io import EntryError
from framework.config.yaml_io import SecretInSweep
from framework.config.yaml_io import load_validated

DEV_MODE_REFUSED = ("servers never run in vLLM's dev mode: its routes (/collective_rpc, /sleep, "
                    "...) skip the API-key check (docs/RELIABILITY.md); remove it")

GPU_LEVERS: tuple[StartupLever, ...] = ("compile_cache", "page_cache", "load_format")
CPU_LEVERS: tuple[StartupLever, ...] = ("warm_start",)

class ServerSpec(_Spec):
    """Fixed vLLM flags (same for every trial) and how a server is started.

    `api_key_env`: the name of an environment variable of the driver holding an API key;
    servers require it (vLLM's VLLM_API_KEY) and the load generator sends it. The key is
    never written to results, logs or reports; an `api-key` flag in `args` or VLLM_API_KEY
    in `env` is rejected (it would be). Without it, servers that listen beyond loopback (a
    joined cluster, `host: node`) get a random key per run (`--no-api-key` opts out).
    `secret_env`: names of further environment variables of the driver (HF_TOKEN, ...) handed
    to every server as the API key is (a call argument of the server actor, not its
    runtime_env), never recorded. A flag or `env` name that looks like a credential
    (config.secret_names) is rejected with that advice, its value never shown; so is
    VLLM_SERVER_DEV_MODE in `env` (its routes skip the API-key check). `dummy_weights`: servers start with
    `--load-format dummy` (random weights: no weight loading, same speed as the real ones,
    meaningless text; vLLM's auto_tune does the same), recorded per trial; `serve_command`
    and `best` leave the flag out.

    `reuse`: a trial whose vLLM flags equal those of the server the previous trial just
    measured on takes that server over (same process; its prefix cache reset in-process through
    the server's control socket, framework.engine.control, so vLLM's dev routes stay closed) instead of
    starting its own; confirmation runs always start fresh servers. With run settings in the
    space (kind: run), TPE / random trials that start a server are followed by their siblings
    (same flags, the other discrete run-setting values), which reuse it.

    `startup_levers`: what may shorten a server's start-up (framework.engine.startup_levers).
    Default on GPU: GPU_LEVERS (`cudagraph_sizes`, `fork_start` and `warm_start` opt-in; the
    default ones change nothing served); on CPU: CPU_LEVERS, `warm_start` (the others are
    inert there).

    `host`: the address servers bind to. `auto` = 127.0.0.1 on a private local Ray, the node's
    own IP on a joined cluster; `node` = always the node's IP; or a literal address.
    """

    args: dict[str, Scalar] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    host: str = "auto"
    startup_timeout_s: float = Field(default=300.0, gt=0)
    api_key_env: str | None = None
    secret_env: tuple[str, ...] = ()
    dummy_weights: bool = False
    reuse: bool = True
    startup_levers: tuple[StartupLever, ...] = GPU_LEVERS

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, name: str | None) -> str | None:
        if name is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError("name an environment variable (letters, digits, '_'); the key "
                             "itself never goes in the sweep file")
        return name

    @model_validator(mode="before")
    @classmethod
    def _no_secrets(cls, data: Any) -> Any:
        """A name in args or env that looks like a credential (`api-key`, VLLM_API_KEY, `hf-token`,
        AWS_SECRET_ACCESS_KEY, ...: config.secret_names) is SecretInSweep, checked before any
        other rule so that no error shows its value; VLLM_SERVER_DEV_MODE in env is refused."""
        for field in ("args", "env"):
            entries = data.get(field) if isinstance(data, dict) else None
            if not isinstance(entries, dict):
                continue
            for entry in entries:
                name = str(entry)
                if secret_names.is_api_key(name):
                    raise SecretInSweep(f"{field}.{name}")
                if secret_names.looks_secret(name):
                    raise SecretInSweep(f"{field}.{name}",
                                        secret_names.safe_way(name, flag=field == "args"))
                if field == "env" and name.upper() == secret_names.DEV_MODE:
                    raise EntryError(f"env.{name}", entries[entry], DEV_MODE_REFUSED)
        return data

    @field_validator("secret_env")
    @classmethod
    def _secret_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"{name!r}: name an environment variable of the driver (letters, "
                                 "digits, '_'); its value never goes in the sweep file")
            if secret_names.is_api_key(name):
                raise ValueError(f"{name}: vLLM's API key is named in server.api_key_env")
            if name.upper() == secret_names.DEV_MODE:
                raise ValueError(f"{name}: {DEV_MODE_REFUSED}")
        if len(set(names)) != len(names):
            raise ValueError(f"repeats a name: {list(names)}")
        return names

    @model_validator(mode="after")
    def _secret_env_not_in_env(self) -> ServerSpec:
        if both := sorted(set(self.secret_env) & set(self.env)):
            raise SecretInSweep(f"env.{both[0]}", f"{both[0]} is also in secret_env: keep it "
                                "there alone (env is recorded, secret_env is not)")
        return self

    @field_validator("args")
    @classmethod
    def _flag_names(cls, args: dict[str, Scalar]) -> dict[str, Scalar]:
        for name in args:
            if name.startswith("-") or name in ("model", "host", "port"):
                raise ValueError(f"flag {name!r}: write flags without leading dashes; "
                                 "model, host and port are set by vllm-sweep")
        return args


def _known_metric(metric: str) -> str:
    if metric not in (*THROUGHPUT_METRICS, *FLEET_OBJECTIVES) and not is_latency_metric(metric):
        raise ValueError(f"unknown metric {metric!r}; use one of "
                         f"{', '.join((*THROUGHPUT_METRICS, *FLEET_OBJECTIVES))} "
                         "or a latency key like p99_ttft_ms")
    return metric


def natural_direction(metric: str) -> Literal["maximize", "minimize"]:
    """Throughputs are maximized, latencies and the fleet's GPUs and costs minimized."""
    return "maximize" if metric in THROUGHPUT_METRICS else "minimize"


class ObjectiveSpec(_Spec):
    """What the search optimizes. `metric`: a throughput (`*_per_gpu` = divided by TP x PP)
    or a latency key. `pareto_with`: further metrics for a multi-objective search (each in
    its natural direction: throughputs up, latencies down); the study then holds a Pareto
    front, `best --pareto` prints it, and `metric` still ranks `best`. A fleet objective
    (vocabulary.FLEET_OBJECTIVES) is minimized: `direction` defaults to minimize for it and
    maximize is an error."""

    metric: str = "output_throughput"
    direction: Literal["maximize", "minimize"] = "maximize"
    pareto_with: tuple[str, ...] = ()
    aggregate: Literal["min", "mean"] = "min"  # over `workloads:` (config.workloads_spec)
    # keep an objective that ranks the offered load rather than the flags (sweep.load_meaning)
    allow_load_bound: bool = False

    @field_validator("metric")
    @classmethod
    def _known(cls, metric: str) -> str:
        return _known_metric(metric)

    @model_validator(mode="before")
    @classmethod
    def _fleet_minimized(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("metric") in FLEET_OBJECTIVES:
            if data.get("direction", "minimize") != "minimize":
                raise ValueError(f"{data['metric']} is minimized (fewer GPUs, lower cost): drop "
                                 "direction or write direction: minimize")
            return {**data, "direction": "minimize"}
        return data

    @field_validator("pareto_with")
    @classmethod
    def _known_all(cls, metrics: tuple[str, ...]) -> tuple[str, ...]:
        for metric in metrics:
            _known_metric(metric)
        if len(set(metrics)) != len(metrics):
            raise ValueError(f"repeats a metric: {list(metrics)}")
        return metrics

    @model_validator(mode="after")
    def _distinct(self) -> ObjectiveSpec:
        if self.metric in self.pareto_with:
            raise ValueError(f"pareto_with repeats the objective metric {self.metric}")
        return self

    @property
    def metrics(self) -> tuple[str, ...]:
        return (self.metric, *self.pareto_with)

    @property
    def directions(self) -> tuple[str, ...]:
        return (self.direction, *(natural_direction(m) for m in self.pareto_with))


FLEET_FROM_CAPACITY = FLEET_OBJECTIVES[:2]  # sized from capacity_rps and target: (fleet.sizing)


class SweepSpec(_Spec):
    name: str
    model: Path
    search_space: Path
    engine: Literal["cpu", "gpu", "fake"] = "cpu"  # fake: FakeEngine, for scheduling tests
    server: ServerSpec = ServerSpec()
    gpu: str | None = None  # GPU type (feasibility.GPUS) for the memory model, engine gpu
    workload: WorkloadSpec = WorkloadSpec()
    workloads: tuple[NamedWorkloadSpec, ...] = ()  # several: `workload` is then the first
    objective: ObjectiveSpec = ObjectiveSpec()
    sla: dict[str, float] = Field(default_factory=dict)
    search: SearchSpec = SearchSpec()
    capacity: CapacitySpec | None = None
    cluster: ClusterSpec = ClusterSpec()
    # a folder, or an object store URI (config/results_location.py, results/object_store.py)
    results_dir: Path | str = Path("results")
    target: TargetSpec | None = None  # the load a deployment must carry (framework.fleet)
    pricing: PricingSpec = PricingSpec()

    @property
    def concurrent_trials(self) -> int | None:
        """The cap on trials side by side (None = as many as the cluster can place)."""
        if self.cluster.max_concurrent_trials is not None:
            return self.cluster.max_concurrent_trials
        if self.cluster.start_ahead:
            return 1 + self.cluster.start_ahead
        return 1 if self.engine == "cpu" else None

    @field_validator("name")
    @classmethod
    def _slug(cls, name: str) -> str:
        if not _NAME.fullmatch(name):
            raise ValueError("use letters, digits, '.', '_' or '-' (at most 64), starting with a "
                             "letter or digit")
        return name

    @field_validator("results_dir", mode="before")
    @classmethod
    def _results_location(cls, value: Any) -> Any:
        """`scheme://...` stays a URI (checked: results_location.uri_problem); any other text
        is a folder."""
        if isinstance(value, str) and is_store_uri(value):
            if problem := uri_problem(value):
                raise ValueError(problem)
            return value
        return Path(value) if isinstance(value, str) else value

    @field_validator("sla")
    @classmethod
    def _sla_keys(cls, sla: dict[str, float]) -> dict[str, float]:
        """Upper bounds on latency keys and error_rate; `min_token_agreement`, a lower bound on
        the quality probe's token agreement with the baseline (framework.trial.quality)."""
        for full_key, limit in sla.items():
            request_class, key = split_class_key(full_key)
            if key == MIN_TOKEN_AGREEMENT and request_class is None:
                if not 0 < limit <= 1:
                    raise ValueError(f"SLA limit for {key} must be in (0, 1], got {limit}")
                continue
            if key != "error_rate" and not is_latency_metric(key):
                raise ValueError(f"SLA on unknown metric {full_key!r}; use latency keys like "
                                 "p99_ttft_ms, error_rate or min_token_agreement (with a mix: "
                                 "<class>.p99_ttft_ms, <class>.error_rate)")
            if key == "error_rate" and not 0 <= limit <= 1:
                raise ValueError(f"SLA limit for error_rate must be in [0, 1], got {limit}")
            if key != "error_rate" and not limit > 0:
                raise ValueError(f"SLA limit for {key} must be > 0, got {limit}")
        return sla

    @model_validator(mode="before")
    @classmethod
    def _cpu_levers(cls, data: Any) -> Any:
        """On the CPU engine, `server.startup_levers` defaults to CPU_LEVERS (GPU: ServerSpec's)."""
        if not isinstance(data, dict) or data.get("engine", "cpu") != "cpu":
            return data
        server = data.get("server") or {}
        if isinstance(server, dict) and "startup_levers" not in server:
            return {**data, "server": {**server, "startup_levers": CPU_LEVERS}}
        return data

    @model_validator(mode="before")
    @classmethod
    def _gpu_sampler(cls, data: Any) -> Any:
        """On the GPU engine, `search.sampler` defaults to `gp` (Optuna's Gaussian process),
        or to `tpe` with `search.prior` (the prior's top k, then TPE with the refitted
        prediction): the strategies that reached 3% of the optimum soonest on GPU-scale spaces
        (benchmarks/search_quality.py, docs/BENCHMARKS.md). Elsewhere SearchSpec's `tpe`."""
        if not isinstance(data, dict) or data.get("engine") != "gpu":
            return data
        search = data.get("search") or {}
        if isinstance(search, dict) and "sampler" not in search:
            return {**data, "search": {**search, "sampler": "tpe" if search.get("prior") else "gp"}}
        return data

    @model_validator(mode="before")
    @classmethod
    def _first_workload(cls, data: Any) -> Any:
        """With `workloads:`, `workload` is the first of them (what reads one workload sees);
        both in one file is an error."""
        return first_workload(data)

    @model_validator(mode="after")
    def _workloads_and_classes(self) -> SweepSpec:
        """Several workloads obey config.workloads_spec; a class-prefixed SLA key names a
        class of a mix."""
        if problem := workloads_problem(self.workloads, self.workload, self.sla,
                                        self.search):
            raise problem
        return self

    @model_validator(mode="after")
    def _quality_needs_baseline(self) -> SweepSpec:
        if MIN_TOKEN_AGREEMENT in self.sla and not self.search.baseline:
            raise ValueError(f"sla.{MIN_TOKEN_AGREEMENT} compares each trial's outputs with the "
                             "baseline's: it needs search.baseline: true")
        return self

    @model_validator(mode="before")
    @classmethod
    def _capacity_objective(cls, data: Any) -> Any:
        """With `capacity:` and no `objective:`, the objective is capacity_rps."""
        if isinstance(data, dict) and data.get("capacity") is not None and "objective" not in data:
            return {**data, "objective": {"metric": "capacity_rps", "direction": "maximize"}}
        return data

    @model_validator(mode="after")
    def _capacity_consistent(self) -> SweepSpec:
        for metric in self.objective.metrics:
            if metric in ("capacity_rps", *FLEET_FROM_CAPACITY) and self.capacity is None:
                raise ValueError(f"objective {metric} needs a capacity: section" + (
                    " (the fleet is sized from each configuration's capacity at the SLA)"
                    if metric in FLEET_FROM_CAPACITY else ""))
            if metric in FLEET_FROM_CAPACITY and self.target is None:
                raise ValueError(f"objective {metric} needs a target: section (the load the "
                                 "fleet must carry, e.g. target: {request_rate: 40})")
        if self.capacity is not None:
            if not (self.objective.metric == "capacity_rps" and self.objective.direction == "maximize"
                    or self.objective.metric in FLEET_OBJECTIVES):
                raise ValueError("with capacity:, the objective is capacity_rps (maximized) or one "
                                 f"of {', '.join(FLEET_OBJECTIVES)} (minimized)")
            if not load_limits(self.sla):
                raise ValueError("capacity: needs an sla on the load (latency keys or "
                                 "error_rate): the capacity is the highest rate at which it holds")
            if self.search.repeats > 1 or self.search.precision is not None:
                raise ValueError("search.repeats and search.precision apply to fixed runs, not "
                                 "to capacity mode")
        if self.search.screen is not None:
            if self.capacity is not None:
                raise ValueError("search.screen applies to fixed runs, not to capacity mode")
            if len(self.objective.metrics) > 1:
                raise ValueError("search.screen needs a single objective (Optuna prunes "
                                 "single-objective studies only); drop objective.pareto_with")
        return self

    @model_validator(mode="after")
    def _percentiles_cover_sla(self) -> SweepSpec:
        have = {percentile_key(m, p) for m in LATENCY_METRICS for p in self.workload.percentiles}
        for key in [*self.sla, *self.objective.metrics]:
            metric = split_class_key(key)[1]
            parsed = parse_latency_key(metric)
            if parsed is not None and parsed.stat.startswith("p") and metric not in have:
                raise ValueError(f"{key} needs percentile {parsed.percentile:g} in "
                                 f"workload.percentiles {list(self.workload.percentiles)}")
        return self

    @model_validator(mode="after")
    def _fleet_one_workload(self) -> SweepSpec:
        metric = next((m for m in self.objective.metrics if m in FLEET_OBJECTIVES), None)
        if metric is not None and self.workloads:
            raise ValueError(f"objective {metric} sizes one workload's fleet; it does not "
                             "combine with workloads: (one metric per workload)")
        return self

    @model_validator(mode="after")
    def _target_from_trace(self) -> SweepSpec:
        if self.target is not None and self.target.from_trace \
                and any(w.dataset != "timed_trace" for w in (self.workload, *self.workloads)):
            raise ValueError("target.from_trace needs every workload's dataset to be timed_trace")
        return self


def load_sweep(path: Path) -> SweepSpec:
    """Read and validate a sweep file; every problem is a one-line ConfigError."""
    return load_validated(path, SweepSpec, "sweep")
