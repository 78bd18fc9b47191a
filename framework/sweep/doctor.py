"""`vllm-sweep doctor`: is this Ray cluster ready for a sweep? One row per check.

Per alive node (`node_probe.probe_node` runs there): its GPUs and their memory, the vLLM /
torch / CUDA / Ray / Python versions (equal across nodes), the servers' cache directory
writable, free server ports. On the driver: the results directory writable. Then, if all of
that passed, short servers started exactly as a sweep starts them (the launcher + `run_trial`,
the sweep's load plan cut to DOCTOR_REQUESTS measured requests and no warm-up): one TP=1 per
GPU type (CPU engine: one CPU server), TP=2 on a node with two GPUs and PP=2 across two nodes
where the cluster has room. Rows, the server plan and the exit code are pure functions of what
was seen (tests/{unit,e2e}/test_doctor.py); `run` wires them to a probe and a launcher the cli passes in,
so this module imports no Ray.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace
from pathlib import Path

from rich.table import Table
from rich.text import Text

from framework.cluster.node_report import MIN_FREE_PORTS
from framework.cluster.node_report import MISSING
from framework.cluster.node_report import VERSION_KEYS
from framework.cluster.node_report import Gpu
from framework.cluster.node_report import NodeReport
from framework.cluster.node_report import writable
from framework.cluster.placement import Bundle
from framework.cluster.placement import Shape
from framework.cluster.placement import bundles
from framework.cluster.placement import fits
from framework.cluster.placement import why_unplaceable
from framework.cluster.ports import SERVER_PORTS
from framework.engine.server_args import server_argv
from framework.engine.server_args import trial_flags
from framework.sweep.loader import Sweep
from framework.sweep.loader import cache_dir
from framework.sweep.loader import feasibility
from framework.sweep.trial_load import load_plan
from framework.trial.measure import LoadPlan
from framework.trial.run import ServerLauncher
from framework.trial.run import TrialOutcome
from framework.trial.run import run_trial

OK, FAIL, SKIPPED = "ok", "FAIL", "skipped"
DOCTOR_REQUESTS = 20  # measured requests per server, no warm-up
REQUIRED = ("vllm", "torch", "ray")  # "missing" on a node is a failure
ALL_NODES, DRIVER = "all nodes", "driver"
PIN = 0.001  # of a node's `node:<ip>` resource (Ray gives every node 1): pins a bundle there
CPU_SKIP = "CPU engine: TP/PP checks need GPUs"

Say = Callable[[str], None]


@dataclass(frozen=True)
class Check:
    """One row of the doctor's table."""

    node: str
    check: str
    result: str  # OK / FAIL / SKIPPED
    detail: str


@dataclass(frozen=True)
class ServerPlan:
    """One server the doctor starts: its row name, shape, and the node each bundle is pinned
    to (() = wherever Ray places it)."""

    name: str
    shape: Shape = Shape()
    nodes: tuple[str, ...] = ()

    def wanted(self, engine: str, cpus_per_worker: int) -> list[Bundle]:
        """The sweep's bundles for this shape, each pinned to its node."""
        out = bundles(self.shape, engine, cpus_per_worker)
        for bundle, ip in zip(out, self.nodes):
            bundle[f"node:{ip}"] = PIN
        return out


def describe_gpus(gpus: Sequence[Gpu]) -> str:
    """"2 x NVIDIA A100-SXM4-80GB (79.3 GiB)", one group per name and size; "no GPU"."""
    counts: dict[tuple[str, float], int] = {}
    for g in gpus:
        key = (g.name, round(g.memory_gib, 1))
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{n} x {name} ({mem:.1f} GiB)" for (name, mem), n in counts.items()) \
        or "no GPU"


def gpu_check(r: NodeReport, engine: str) -> Check:
    """GPU engine: every GPU Ray offers on the node must be a CUDA device torch sees."""
    seen = describe_gpus(r.gpus)
    if engine == "fake":
        return Check(r.node_ip, "GPUs", OK, f"{seen}; Ray offers {r.ray_gpus} (the fake engine "
                     "uses none)")
    if engine == "gpu" and r.ray_gpus > r.cuda_visible:
        sees = "no CUDA device" if r.cuda_visible == 0 else f"only {r.cuda_visible} CUDA device(s)"
        return Check(r.node_ip, "GPUs", FAIL,
                     f"Ray offers {r.ray_gpus} GPU(s) but torch.cuda sees {sees} (torch "
                     f"{r.versions.get('torch', '?')}, CUDA {r.versions.get('cuda', '?')}); "
                     f"nvidia-smi: {seen}")
    if r.gpus and r.ray_gpus == 0:
        seen += "; Ray offers none of them to trials"
    elif r.gpus and engine == "cpu":
        seen += " (the CPU engine uses none)"
    return Check(r.node_ip, "GPUs", OK, seen)


def cache_check(r: NodeReport) -> Check:
    if r.cache_error:
        return Check(r.node_ip, "cache dir", FAIL, f"{r.cache_dir}: {r.cache_error}")
    return Check(r.node_ip, "cache dir", OK, f"{r.cache_dir} writable")


def ports_check(r: NodeReport) -> Check:
    span = f"{SERVER_PORTS.start}-{SERVER_PORTS.stop - 1}"
    detail = f"{r.free_ports} of {MIN_FREE_PORTS} picked ports free in {span}"
    return Check(r.node_ip, "server ports", OK if r.free_ports >= MIN_FREE_PORTS else FAIL, detail)


def version_check(reports: Sequence[NodeReport]) -> Check:
    """vLLM, torch, CUDA, Ray and Python equal on every probed node; vLLM, torch and Ray
    installed. A difference names each version and its nodes."""
    probed = [r for r in reports if not r.error]
    if not probed:
        return Check(ALL_NODES, "versions", FAIL, "no node could be probed")
    problems = []
    for key in VERSION_KEYS:
        nodes_of: dict[str, list[str]] = {}
        for r in probed:
            nodes_of.setdefault(r.versions.get(key, MISSING), []).append(r.node_ip)
        if len(nodes_of) > 1:
            problems.append(f"{key} differs: " + "; ".join(
                f"{version} on {', '.join(ips)}" for version, ips in nodes_of.items()))
        elif key in REQUIRED and MISSING in nodes_of:
            problems.append(f"{key} is not installed on {', '.join(nodes_of[MISSING])}")
    if problems:
        return Check(ALL_NODES, "versions", FAIL, " | ".join(problems))
    same = probed[0].versions
    return Check(ALL_NODES, "versions", OK, ", ".join(f"{k} {same.get(k, MISSING)}"
                                                      for k in VERSION_KEYS)
                 + f" on {len(probed)} node(s)")


def node_checks(reports: Sequence[NodeReport], engine: str) -> list[Check]:
    """Per node (by IP): GPUs, cache dir, server ports (or the probe's failure); then the
    versions across nodes."""
    rows: list[Check] = []
    for r in sorted(reports, key=lambda r: r.node_ip):
        if r.error:
            rows.append(Check(r.node_ip, "probe", FAIL, r.error))
        else:
            rows += [gpu_check(r, engine), cache_check(r), ports_check(r)]
    return rows + [version_check(reports)]


def plan_servers(reports: Sequence[NodeReport], engine: str) -> list[ServerPlan | Check]:
    """The servers to start, in row order; a shape the cluster has no room for is its SKIPPED
    row. CPU engine: one TP=1 server anywhere. GPU engines: TP=1 on the first node of each GPU
    type, TP=2 on the first node with 2 GPUs, PP=2 over the first two nodes with a GPU."""
    if engine == "cpu":
        return [ServerPlan("server TP=1 (CPU)"), Check(ALL_NODES, "server TP=2", SKIPPED, CPU_SKIP),
                Check(ALL_NODES, "server PP=2", SKIPPED, CPU_SKIP)]
    with_gpus = [r for r in sorted(reports, key=lambda r: r.node_ip)
                 if not r.error and r.ray_gpus >= 1]
    if not with_gpus:
        return [Check(ALL_NODES, "servers", FAIL, "Ray offers no GPU on any node")]
    first_of_type: dict[str, str] = {}
    for r in with_gpus:
        first_of_type.setdefault(r.gpus[0].name if r.gpus else "GPU", r.node_ip)
    out: list[ServerPlan | Check] = [ServerPlan(f"server TP=1 ({name})", Shape(), (ip,))
                                     for name, ip in first_of_type.items()]
    two = next((r for r in with_gpus if r.ray_gpus >= 2), None)
    out.append(ServerPlan("server TP=2", Shape(tp=2), (two.node_ip,) * 2) if two else
               Check(ALL_NODES, "server TP=2", SKIPPED, "no node offers 2 GPUs"))
    out.append(ServerPlan("server PP=2", Shape(pp=2), (with_gpus[0].node_ip, with_gpus[1].node_ip))
               if len(with_gpus) >= 2 else
               Check(ALL_NODES, "server PP=2", SKIPPED,
                     f"needs 2 nodes with a GPU, the cluster has {len(with_gpus)}"))
    return out


def server_check(server: ServerPlan, outcome: TrialOutcome, sent: int, log_path: Path) -> Check:
    """A started server's row: ok when every request succeeded."""
    where = ", ".join(dict.fromkeys(outcome.placement or (outcome.node_ip,))) \
        or ", ".join(server.nodes) or "-"
    if not outcome.ok:
        return Check(where, server.name, FAIL,
                     f"{outcome.fail_reason}: {outcome.fail_detail[:300]} (log: {log_path})")
    done = int(outcome.metrics.get("completed", 0))
    detail = (f"{done}/{sent} requests ok, ready in {outcome.startup_s or 0:.0f} s, "
              f"{outcome.metrics.get('output_throughput', 0.0):.0f} output tok/s")
    if done < sent:
        error = next((r.error for r in outcome.records if r.error), "")
        return Check(where, server.name, FAIL, f"{detail}; first error: {error[:200]} "
                     f"(log: {log_path})")
    return Check(where, server.name, OK, detail)


def doctor_plan(plan: LoadPlan, requests: int = DOCTOR_REQUESTS) -> LoadPlan:
    """The sweep's load plan cut to `requests` measured requests: no warm-up, no repeats,
    screening, capacity steps, duration or early stop."""
    arrivals = list(plan.arrivals)[:requests] if plan.arrivals is not None else None
    return replace(plan, measured=list(plan.measured)[:requests], warmup=[], arrivals=arrivals,
                   repeat_requests=[], screen=[], screen_arrivals=None, capacity=None,
                   sla_guard=None, duration_s=None)


def exit_code(checks: Sequence[Check], on_failure: int) -> int:
    """0 when no row failed (skipped rows are fine), else `on_failure`."""
    return on_failure if any(c.result == FAIL for c in checks) else 0


def table(checks: Sequence[Check]) -> Table:
    out = Table(title="vllm-sweep doctor")
    for name in ("node", "check", "result", "detail"):
        out.add_column(name, overflow="fold")
    style = {OK: "green", FAIL: "bold red", SKIPPED: "yellow"}
    for c in checks:
        out.add_row(Text(c.node), Text(c.check), Text(c.result, style=style[c.result]),
                    Text(c.detail))
    return out


class Heartbeat:
    """Says the last phase again, with its time so far, every `every_s` while nothing new was
    said (a CPU server takes ~40 s to start, and says nothing meanwhile)."""

    def __init__(self, say: Say, every_s: float = 15.0) -> None:
        self.say, self.every_s = say, every_s
        self._last, self._began, self._said = "", 0.0, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def __call__(self, text: str) -> None:
        self._last, self._began = text, time.monotonic()
        self._said = self._began
        self.say(text)

    def _beat(self) -> None:
        while not self._stop.wait(1.0):
            now = time.monotonic()
            if self._last and now - self._said >= self.every_s:
                self._said = now
                self.say(f"{self._last} ... {now - self._began:.0f} s")

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def results_check(sw: Sweep) -> Check:
    """The results dir takes writes: a file made in the folder, or an object written, read
    back and deleted in the object store."""
    where = sw.spec.results_dir
    if isinstance(where, Path):
        err = writable(where)
        return Check(DRIVER, "results dir", FAIL if err else OK,
                     f"{where.resolve()}{': ' + err if err else ' writable'}")
    mirror = sw.store.mirror
    problem = mirror.write_probe() if mirror is not None else "no object store"
    return Check(DRIVER, "results dir", FAIL if problem else OK,
                 f"{sw.store.location}{': ' + problem if problem else ' takes writes'}")


def run(sw: Sweep, local: bool, host: str, launcher: ServerLauncher,
        probe: Callable[[str, str], list[NodeReport]], say: Say) -> list[Check]:
    """Every check of the doctor, in table order. `probe(cache_dir, host)` reports on each
    alive node (node_probe.probe_all_nodes); the servers start only if the other checks
    passed, since a known problem would only make them fail less clearly."""
    spec = sw.spec
    # a bad workload is bad input (exit 2) before anything
    plan = doctor_plan(load_plan(spec, sw.api_key))
    rows = [results_check(sw)]
    cache = cache_dir(spec, local)
    say(f"probing every alive node (cache dir {cache})")
    reports = probe(cache, host)
    rows += node_checks(reports, spec.engine)
    planned = plan_servers(reports, spec.engine)
    if any(c.result == FAIL for c in rows):
        return rows + [p if isinstance(p, Check) else
                       Check(ALL_NODES, p.name, SKIPPED, "not started: the checks above failed")
                       for p in planned]
    resources = [dict(r.resources) for r in reports if not r.error]
    for p in planned:
        rows.append(p if isinstance(p, Check) else
                    _serve(sw, p, plan, launcher, resources, say))
    return rows


def _serve(sw: Sweep, server: ServerPlan, plan: LoadPlan, launcher: ServerLauncher,
           resources: list[dict[str, float]], say: Say) -> Check:
    """Start one server as a sweep would (its fixed flags, this shape), send the plan, stop."""
    spec = sw.spec
    where = ", ".join(dict.fromkeys(server.nodes)) or ALL_NODES
    shape = {"tensor-parallel-size": server.shape.tp, "pipeline-parallel-size": server.shape.pp}
    flags = trial_flags(spec.server.args, {k: v if v > 1 else None for k, v in shape.items()},
                        False)
    if spec.server.dummy_weights:
        flags["load-format"] = "dummy"
    wanted = server.wanted(spec.engine, spec.cluster.cpus_per_worker)
    if not fits(wanted, resources):
        return Check(where, server.name, FAIL, why_unplaceable(wanted, resources))
    devices = None if spec.engine == "cpu" else int(sum(n.get("GPU", 0) for n in resources))
    feas = feasibility(sw, flags, devices)
    if feas is not None and not feas.ok:
        return Check(where, server.name, SKIPPED, "the feasibility model rules it out: "
                     + "; ".join(feas.reasons))
    slug = re.sub(r"[^A-Za-z0-9=.]+", "-", server.name).strip("-")
    log_path = sw.store.sweep_dir / "doctor" / f"{slug}.log"
    log_path.unlink(missing_ok=True)  # this run's log only
    model = str(spec.model)
    try:
        with Heartbeat(lambda text: say(f"{server.name}: {text}")) as phase:
            outcome = run_trial(launcher, lambda h, port: server_argv(model, flags, h, port),
                                plan, log_path, wanted, phase=phase)
        check = server_check(server, outcome, len(plan.measured), log_path)
    except Exception as exc:  # noqa: BLE001 - a launch the launcher could not even attempt
        check = Check(where, server.name, FAIL, f"{type(exc).__name__}: {exc}"[:400])
    say(f"{server.name}: {check.result} ({check.detail})")
    return check
