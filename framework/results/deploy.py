"""The configuration a sweep ships, with what deploying it takes: its flags, its measured value
and interval, its hardware, and (with a `target:`) the fleet that carries the target and its cost.

Which trial ships is the verdict's alone (results.verdict: the winner, or vLLM's defaults when
nothing beat them beyond the noise), its flags what `best` prints (status.shipped_flags). Its
fleet and cost are the Decision's builder's (results.decision.fleet_answer) at the given target
and price: replicas from the least favourable fresh-server capacity_rps (sizing_row), TP x PP
from its flags, cost per million output tokens from that measurement's output_throughput.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from framework.base.errors import ConfigError
from framework.config.specs import SweepSpec
from framework.engine.kv_transfer import CONNECTORS
from framework.engine.kv_transfer import default_connector
from framework.engine.kv_transfer import kv_transfer_args
from framework.engine.kv_transfer import kv_transfer_config
from framework.engine.memory_model import GIB
from framework.engine.memory_model import read_model_facts
from framework.engine.memory_model import weight_bytes_per_gpu
from framework.engine.server_args import flag_args
from framework.fleet.columns import Sizing
from framework.fleet.columns import Target
from framework.fleet.manifests import Deployment
from framework.fleet.manifests import ModelSource
from framework.fleet.manifests import PodSize
from framework.fleet.manifests import pod_size
from framework.fleet.prices import Price
from framework.results.decision import FleetAnswer
from framework.results.decision import device_of
from framework.results.decision import fleet_answer
from framework.results.decision import sizing_row
from framework.results.rows import param_column
from framework.results.status import shipped_flags
from framework.results.verdict import Estimate
from framework.results.verdict import SweepVerdict
from framework.results.verdict import decide


@dataclass(frozen=True)
class Shipped:
    """One sweep's shipped configuration. `value`: the objective's estimate (geometric mean over
    fresh servers, 95% interval when the noise is known); `sized`: its fleet answer at the
    target and price (target_rps None without a target); None fields: not measured / no price."""

    sweep: str
    trial: int
    verdict: SweepVerdict
    objective: str
    value: Estimate | None
    model: str
    flags: dict[str, Any]
    serve_command: str
    engine: str
    gpu: str | None
    hardware: str | None
    tp: int
    pp: int
    output_throughput: float | None
    sized: FleetAnswer | None
    price: Price | None
    model_sha256: str | None
    workload_sha256: str | None
    dp: int = 1
    servers: int = 1  # the replicas shape: servers measured together behind a router
    prefill: int = 0  # of those, prefill servers (prefill/decode)

    @property
    def devices(self) -> int:
        """Devices of one server: TP x PP x DP."""
        return self.tp * self.pp * self.dp


    @property
    def fleet(self) -> FleetAnswer | None:
        """The fleet that carries the target; None without a target."""
        s = self.sized
        return s if s is not None and s.target_rps is not None else None

    @property
    def capacity_rps(self) -> float | None:
        return None if self.sized is None else self.sized.capacity_rps

    @property
    def cost_per_mtok(self) -> float | None:
        """Cost per million output tokens of one replica; None without a price."""
        return None if self.sized is None else self.sized.cost_per_mtok_output


def _float(row: pd.Series, column: str) -> float | None:
    value = row.get(column)
    return None if value is None or pd.isna(value) else float(value)


def _text(row: pd.Series, column: str) -> str | None:
    value = row.get(column)
    return None if value is None or pd.isna(value) else str(value)


def shipped(trials: pd.DataFrame, spec: SweepSpec, params: Sequence[str],
            run_params: Sequence[str] = (), *, target: Target | None = None,
            price_of: Callable[[int, int, int], Price | None] = lambda tp, pp, dp: None
            ) -> Shipped | SweepVerdict:
    """The sweep's shipped configuration, or its verdict when there is nothing to ship.
    `target`: the rate the fleet carries (the loaded sweep's, or one given on the command
    line); `price_of(tp, pp, dp)`: a replica's price (the loaded sweep's `price`). The fleet is
    sized, as the Decision is (results.decision.sizing_row), on the configuration's least
    favourable fresh-server measurement."""
    metric = spec.objective.metric
    verdict = decide(trials, metric, spec.objective.direction == "maximize", spec.sla)
    if verdict.ship is None:
        return verdict
    row, flags = shipped_flags(trials, verdict.ship, params, dict(spec.server.args), run_params)
    est = verdict.estimate if verdict.number is not None else verdict.baseline
    sizing = sizing_row(trials, verdict.ship)
    tp = int(flags.get("tensor-parallel-size") or 1)
    pp = int(flags.get("pipeline-parallel-size") or 1)
    dp = int(flags.get("data-parallel-size") or 1)
    prefill = _shape_setting(row, params, "prefill-servers", 0)
    servers = _shape_setting(row, params, "replicas", 1) + prefill
    price = price_of(tp, pp, dp)
    sized = fleet_answer(trials, verdict, currency=spec.pricing.currency,
                         device=device_of(spec.engine),
                         sizing=Sizing(target, price, tp, pp, dp, servers))
    return Shipped(
        sweep=spec.name, trial=verdict.ship, verdict=verdict, objective=metric, value=est,
        model=str(spec.model), flags=flags, serve_command=str(row["serve_command"]),
        engine=spec.engine, gpu=spec.gpu, hardware=_text(row, "hardware"), tp=tp, pp=pp,
        output_throughput=None if sizing is None else _float(sizing, "output_throughput"),
        sized=sized, price=price,
        model_sha256=_text(row, "model_config_sha256"), workload_sha256=_text(row, "workload_sha256"),
        dp=dp, servers=servers, prefill=prefill)


def _shape_setting(row: pd.Series, params: Sequence[str], name: str, default: int) -> int:
    """The shipped trial's shape setting `name` (search_space.SHAPE_SETTINGS), else `default`."""
    if name not in params:
        return default
    value = row.get(param_column(name))
    return default if value is None or pd.isna(value) else int(value)


def served_name(s: Shipped) -> str:
    """The name clients send: `served-model-name` if set, else a local model folder's name,
    else the model id."""
    named = s.flags.get("served-model-name")
    if named:
        return str(named)
    return s.model.rstrip("/").rsplit("/", 1)[-1] if s.model.startswith("/") else s.model


def deployment(s: Shipped, image: str, *, source: ModelSource | None = None,
               api_key_secret: str | None = None, env: dict[str, str] | None = None,
               size: PodSize | None = None) -> Deployment:
    """What the deployment files of fleet.manifests need (the keyword arguments: Kubernetes'
    alone, fleet.manifests.Deployment)."""
    return Deployment(name=s.sweep, model=s.model, served_name=served_name(s), flags=s.flags,
                      argv=(s.model, *flag_args(s.flags)), engine=s.engine, gpu=s.gpu, tp=s.tp,
                      pp=s.pp, replicas=s.fleet.replicas if s.fleet else (
                          s.servers if s.servers > 1 else None), image=image,
                      source=source, api_key_secret=api_key_secret, env=env or {}, size=size,
                      dp=s.dp, servers=s.servers, prefill=s.prefill,
                      kv_transfer=kv_transfer(s) if s.prefill else None)


def shipped_connector(s: Shipped) -> tuple[str, str | None]:
    """The KV connector a shipped prefill/decode deployment runs (engine.kv_transfer's default
    for its engine) and its folder in the exports (KV_FOLDER where it needs one)."""
    connector = default_connector(s.engine)
    return connector, KV_FOLDER if CONNECTORS[connector].shared_folder else None


def kv_transfer(s: Shipped) -> dict[str, object]:
    """What every server of a shipped prefill/decode deployment gets, as vLLM's
    KVTransferConfig mapping (the `--kv-transfer-config` value, parsed)."""
    return dict(json.loads(kv_transfer_config(*shipped_connector(s))))


WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.pt")  # the first that matches is the checkpoint
_CORES = re.compile(r"^cpu: .* x (\d+)$")


def weights_bytes(model: Path, flags: dict[str, Any] | None = None) -> int | None:
    """The model's weights in bytes: its folder's checkpoint files (safetensors, else .bin,
    else .pt), else the memory model's estimate from config.json (a folder of config alone,
    e.g. a dummy-weights sweep's) at the flags' quantization and dtype, else None."""
    for pattern in WEIGHT_GLOBS:
        files = [f for f in model.glob(pattern) if f.is_file()] if model.is_dir() else []
        if files:
            return sum(f.stat().st_size for f in files)
    flags = flags or {}
    try:
        facts = read_model_facts(model)
    except (ConfigError, OSError, ValueError):
        return None
    quantization = flags.get("quantization")
    return int(weight_bytes_per_gpu(facts, 1, 1, None if quantization is None else str(quantization),
                                    str(flags.get("dtype") or "auto")))


def node_cpus(hardware: str | None) -> int | None:
    """The logical cores of a CPU sweep's node, from the rows' `hardware` ("cpu: <model name>
    x <cores>", results.provenance), else None."""
    m = _CORES.match(hardware or "")
    return int(m.group(1)) if m and int(m.group(1)) > 0 else None


def size_of(s: Shipped, weights: int | None, *, kv_space_gib: float = 0.0,
            from_hub: bool = False) -> PodSize:
    """One Kubernetes replica of `s` (fleet.manifests.pod_size): `weights` in bytes; the CPU
    engine's KV cache is `kv_space_gib` (VLLM_CPU_KVCACHE_SPACE) per worker; a model `from_hub`
    is downloaded into HOME, whose size grows by the weights."""
    workers = s.devices
    kv = int(kv_space_gib * GIB) * workers if s.engine == "cpu" else 0
    return pod_size(s.engine, workers, weights_bytes=weights, kv_cache_bytes=kv,
                    node_cpus=node_cpus(s.hardware),
                    download_bytes=(weights or 0) if from_hub else 0)


SERVE_PORT = 8000  # the entry point's port in `export --format serve` (vLLM's default)
KV_FOLDER = "/mnt/shared/vllm-kv"  # ExampleConnector's folder in the exported commands


def serve_text(s: Shipped) -> str:
    """`export --format serve`: the commands to run. One server: its `vllm serve` line.
    Several: one `vllm serve` per server on ports SERVE_PORT+1.. (prefill servers first, each
    with the KV connector's flag), then the router they were measured behind
    (framework/engine/router.py) on SERVE_PORT, as it ran in the sweep."""
    if s.servers == 1:
        return s.serve_command + "\n"
    ports = [SERVE_PORT + 1 + i for i in range(s.servers)]
    extra: list[str] = []
    if s.prefill:
        connector, folder = shipped_connector(s)
        extra = kv_transfer_args(connector, folder)
        lines = [f"# {s.prefill} prefill + {s.servers - s.prefill} decode servers behind a "
                 f"router, as measured (trial {s.trial}); {connector}"
                 + (f": {KV_FOLDER} must be one folder every server sees" if folder else "")]
    else:
        lines = [f"# {s.servers} replicas of one server behind a router, as measured "
                 f"(trial {s.trial}); run each server where its devices are"]
    lines += [shlex.join(["vllm", "serve", s.model, *flag_args(s.flags), *extra, "--port",
                          str(port)]) for port in ports]
    router = ["python", "-m", "framework.engine.router", "--host", "0.0.0.0", "--port",
              str(SERVE_PORT)]
    for i, port in enumerate(ports):
        router += ["--prefill" if i < s.prefill else "--backend", f"http://127.0.0.1:{port}"]
    return "\n".join([*lines, shlex.join(router)]) + "\n"


def _finite(x: float | None) -> float | None:
    return x if x is None or math.isfinite(x) else None


def as_json(s: Shipped) -> dict[str, object]:
    """Everything a pipeline needs, JSON-ready (null where not measured or not priced)."""
    est, gain = s.value, s.verdict.gain
    out: dict[str, object] = {
        "sweep": s.sweep, "trial": s.trial, "verdict": s.verdict.kind,
        "statement": s.verdict.headline, "model": s.model, "flags": s.flags,
        "serve_argv": ["vllm", "serve", s.model, *flag_args(s.flags)],
        "serve_command": s.serve_command,
        "objective": {"metric": s.objective, "value": est.value if est else None,
                      "ci95": [est.low, est.high] if est and est.low is not None else None,
                      "servers": est.servers if est else None},
        "gain": None if gain is None else {"value": gain.value, "ci95": [gain.low, gain.high]},
        "engine": s.engine, "gpu": s.gpu, "hardware": s.hardware,
        "tensor_parallel_size": s.tp, "pipeline_parallel_size": s.pp,
        "data_parallel_size": s.dp, "servers": s.servers, "prefill_servers": s.prefill,
        "capacity_rps": _finite(s.capacity_rps), "output_throughput": _finite(s.output_throughput),
        "price": None if s.price is None else {
            "per_replica_hour": s.price.per_replica_hour, "per_gpu_hour": s.price.per_gpu_hour,
            "currency": s.price.currency, "source": s.price.source},
        "cost_per_mtok": s.cost_per_mtok,
    }
    if s.fleet is not None:
        f = s.fleet
        out["fleet"] = {"target_rps": f.target_rps, "headroom": f.headroom, "replicas": f.replicas,
                        "gpus_per_replica": s.devices, "gpus": f.gpus,
                        "cost_per_hour": f.cost_per_hour}
    return out
