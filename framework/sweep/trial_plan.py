"""One asked trial as the runner carries it: what it needs, worked out once right after ask
(`TrialPlan`), whether it may launch at all (`rejection`), and a launched trial until its
outcome is recorded (`Running`). Pure but for `rejection`'s feasibility model."""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC
from datetime import datetime
from pathlib import Path

from framework.base.vocabulary import Scalar
from framework.cluster.placement import Bundle
from framework.cluster.placement import Shape
from framework.cluster.placement import bundles
from framework.cluster.placement import fits
from framework.cluster.placement import node_unit
from framework.cluster.placement import shape_of
from framework.cluster.placement import shape_problem
from framework.cluster.placement import why_unplaceable
from framework.config.search_space import SearchSpace
from framework.config.search_space import discrete_values
from framework.config.search_space import shape_setting
from framework.engine.feasibility import Feasibility
from framework.engine.kv_transfer import CONNECTORS
from framework.engine.kv_transfer import default_connector
from framework.engine.server_args import serve_command
from framework.engine.server_args import server_argv
from framework.engine.server_args import trial_flags
from framework.engine.startup_levers import plan_levers
from framework.search.tuner import Proposal
from framework.sweep.loader import Sweep
from framework.sweep.loader import feasibility
from framework.sweep.loader import has_safetensors
from framework.sweep.loader import installed_loaders
from framework.sweep.trial_load import with_run_settings
from framework.trial.measure import LoadPlan
from framework.trial.run import TrialOutcome


@dataclass(frozen=True)
class TrialPlan:
    """An asked trial: its vLLM flags as recorded (`serve_flags`: as the server gets them,
    with `load-format: dummy` under server.dummy_weights), its shape, bundles and node unit
    (placement), its server key (trials with equal keys may share a server; the row's
    `serve_command`) and its load (the sweep's, with the trial's run settings).
    `replicas` (a `kind: shape` setting): that many identical servers behind a router, each
    with `wanted` (its own placement group); `devices`, `all_wanted` and `shape_label` count
    them all."""

    proposal: Proposal
    flags: Mapping[str, Scalar | None]
    serve_flags: Mapping[str, Scalar | None]
    shape: Shape
    wanted: tuple[Bundle, ...]
    unit: int
    key: str
    load: LoadPlan
    levers: tuple[str, ...] = ()  # start-up levers used (framework.engine.startup_levers)
    replicas: int = 1
    prefill: int = 0  # prefill servers in front of the replicas (prefill/decode)

    @property
    def number(self) -> int:
        return self.proposal.number

    @property
    def servers(self) -> int:
        """Servers of the deployment: the replicas and the prefill servers."""
        return self.replicas + self.prefill

    @property
    def devices(self) -> int:
        """Devices of the whole deployment: the shape's (TP x PP x DP) x servers."""
        return self.shape.devices * self.servers

    @property
    def all_wanted(self) -> tuple[Bundle, ...]:
        """Every server's bundles: what the trial needs of the cluster at once."""
        return self.wanted * self.servers

    @property
    def shape_label(self) -> str:
        """`TP1xPP1` for one server, `2xTP1xPP1` for two replicas of it, `1P1DxTP1xPP1` for
        one prefill and one decode server."""
        if self.prefill:
            return f"{self.prefill}P{self.replicas}Dx{self.shape.label}"
        return self.shape.label if self.replicas == 1 else f"{self.replicas}x{self.shape.label}"

    @property
    def server_key(self) -> str:
        """Trials with equal keys may share running servers: the serve command, and the
        deployment's shape when it is more than one server."""
        return self.key if self.servers == 1 else f"{self.key}  # {self.shape_label}"

    def argv(self, model: str, host: str, port: int) -> list[str]:
        return server_argv(model, self.serve_flags, host, port)


def plan_trial(sweep: Sweep, p: Proposal, load: LoadPlan) -> TrialPlan:
    """Everything trial `p` needs that follows from the sweep and its parameters."""
    spec = sweep.spec
    flags = trial_flags(spec.server.args, sweep.space.server_params(p.params), p.is_baseline)
    shape = shape_of(flags)
    serve_flags = {**flags, "load-format": "dummy"} if spec.server.dummy_weights else flags
    levers = plan_levers(spec.server.startup_levers, engine=spec.engine, flags=serve_flags,
                         installed=installed_loaders(), safetensors=has_safetensors(spec.model))
    serve_flags = {**serve_flags, **levers.flags}
    shape_settings = sweep.space.shape_settings(p.params)
    return TrialPlan(proposal=p, flags=flags, serve_flags=serve_flags, shape=shape,
                     levers=levers.names,
                     wanted=tuple(bundles(shape, spec.engine, spec.cluster.cpus_per_worker)),
                     unit=node_unit(shape), key=serve_command(str(spec.model), flags),
                     load=with_run_settings(load, spec, sweep.space.run_settings(p.params)),
                     replicas=shape_setting(shape_settings, "replicas"),
                     prefill=shape_setting(shape_settings, "prefill-servers"))


@dataclass(frozen=True)
class Running:
    """A launched trial until its outcome is recorded: where its server logs (the reused
    server's log when it took one over)."""

    plan: TrialPlan
    feasibility: Feasibility | None
    log_path: Path


def _devices(sweep: Sweep, nodes: Sequence[Mapping[str, float]]) -> int | None:
    """Devices a trial may span: the cluster's GPUs (None on the CPU engine, whose workers
    are bounded by placement instead)."""
    return None if sweep.spec.engine == "cpu" else int(sum(n.get("GPU", 0) for n in nodes))


def _text(value: Scalar | None) -> str | None:
    return None if value is None else str(value)


def may_prefill(space: SearchSpace) -> bool:
    """Whether some trial of `space` runs prefill servers (prefill-servers above 0)."""
    param = space.parameters.get("prefill-servers")
    return param is not None and any(v for v in discrete_values(param) or ())


def prefill_decode_problem(engine: str, prefill: int, nodes: int,
                           shared_folder: str | None = None) -> str | None:
    """Why a prefill/decode trial cannot hand its KV over (None if it can). The CPU engine's
    connector (engine.kv_transfer) keeps it in files both servers must see: a private folder
    on the driver's node, which on a cluster of several nodes only that node sees, unless
    cluster.shared_folder names one every node shares (checked at the sweep's start,
    cluster/shared_folder.py). On GPUs, NixlConnector needs the proxy to hand each prefill
    answer's kv_transfer_params to the decode request, which the router does not do yet.
    Pure."""
    connector = default_connector(engine)
    if not prefill:
        return None
    if not CONNECTORS[connector].shared_folder:
        return (f"prefill/decode with {connector}: the router does not yet pass the prefill "
                "server's kv_transfer_params to the decode server, which this connector needs")
    if nodes <= 1 or shared_folder:
        return None
    return (f"prefill/decode with {connector} keeps the KV in files both servers must see, and "
            f"on this {nodes}-node cluster they may run on different nodes: set "
            "cluster.shared_folder to a folder every node mounts (a shared file system), or "
            "run it on one node")


def rejection(sweep: Sweep, plan: TrialPlan, nodes: Sequence[Mapping[str, float]]
              ) -> tuple[TrialOutcome | None, Feasibility | None]:
    """A trial that must not launch (it can never be placed on `nodes`, its executor cannot
    start in its group (placement.shape_problem), or the memory model says it cannot work)
    as its outcome, with its feasibility; (None, feasibility) when it
    may launch."""
    now = datetime.now(UTC)
    if not fits(plan.all_wanted, nodes, plan.unit):
        return TrialOutcome(started_at=now, argv=(), fail_reason="unplaceable",
                            fail_detail=why_unplaceable(plan.all_wanted, nodes, plan.unit)), None
    problem = (shape_problem(sweep.spec.engine,
                             _text(plan.flags.get("distributed-executor-backend")), plan.shape)
               or prefill_decode_problem(sweep.spec.engine, plan.prefill, len(nodes),
                                         sweep.spec.cluster.shared_folder))
    if problem:
        return TrialOutcome(started_at=now, argv=(), fail_reason="infeasible",
                            fail_detail=problem), Feasibility(ok=False, reasons=(problem,),
                                                              violation=1.0)
    feas = feasibility(sweep, plan.flags, _devices(sweep, nodes))
    if feas is not None and not feas.ok:
        return TrialOutcome(started_at=now, argv=(), fail_reason="infeasible",
                            fail_detail="; ".join(feas.reasons)), feas
    return None, feas
