"""`vllm-sweep` command line: thin argument parsing over the modules below. `run` and `doctor`
live here; the other commands' arguments and work are in framework/sweep/*_cli.py (results_cli:
status, best, compact, report; plan_cli: validate, plan; deploy_cli: export, compare; job_cli:
submit; setup_cli: build-model, build-conversations), which this module only registers.

Exit codes: 0 success, 1 `best` or `export` has no configuration to print (the sweep has no
results yet, or no feasible trial), 2 bad input (one line naming file, key and value; `report`
of a sweep without results), 3 cluster problem (or another driver runs the sweep, the results'
object store cannot be read or written, or a `doctor` check failed), 4 `run` ended and no
configuration meets the SLA (EXIT_NO_FEASIBLE), 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

from framework import __version__
from framework.base.errors import ClusterError
from framework.base.errors import ConfigError
from framework.base.errors import StoreError
from framework.base.exit_codes import EXIT_BAD_INPUT
from framework.base.exit_codes import EXIT_CLUSTER
from framework.base.exit_codes import EXIT_INTERRUPTED

SWEEP_HELP = "sweep YAML file (e.g. sweeps/quickstart.yaml)"


def _signal_as_interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _interrupt_on_signals() -> None:
    """SIGTERM (`ray job stop`, kill) and SIGHUP (the ssh session or terminal closed) end the
    command as Ctrl-C does: servers stopped, trials in flight recorded, exit 130. A SIGHUP the
    caller ignores (`nohup`) stays ignored. Call after ray.init: Ray's own failure-signal
    handler replaces any installed before it and ends the process without that cleanup."""
    signal.signal(signal.SIGTERM, _signal_as_interrupt)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, _signal_as_interrupt)


NO_API_KEY_HELP = ("start servers that listen beyond loopback (a joined cluster, `host: node`) "
                   "without the random per-run API key they get by default (anyone who can "
                   "reach a node could then send them requests and skew the measurements)")


def _run_key(sw: Any, local: bool, host: str, no_api_key: bool,
             warn: Any) -> tuple[Any, dict[str, str]]:
    """The sweep with the run's API key (loader.run_api_key) and the servers' secret_env; with
    `--no-api-key` where it leaves servers open, one warning line through `warn`. The key is
    never printed."""
    from framework.sweep import loader as sweep_mod

    key = sweep_mod.run_api_key(sw.spec, local, host, no_api_key)
    if key is None and no_api_key and (not local or sweep_mod.beyond_loopback(host)):
        warn(f"warning: --no-api-key: servers listen on {host} without an API key; anyone who "
             "can reach a node can send them requests and skew the measurements")
    return sw.with_api_key(key), sweep_mod.server_secrets(sw.spec, key)


def cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from framework.cluster import RayLauncher
    from framework.cluster import RaySession
    from framework.cluster.autoscaling import AutoscalingConfigError
    from framework.cluster.autoscaling import find_scale_up
    from framework.cluster.driver_session import DriverSession
    from framework.cluster.shared_folder import check_shared_folder
    from framework.sweep import loader as sweep_mod
    from framework.sweep.runner import Runner
    from framework.sweep.trial_plan import may_prefill

    console = Console(width=None if sys.stdout.isatty() else 140)
    sw = sweep_mod.load(Path(args.sweep))
    sweep_mod.check_tokenizer(sw)
    spec = sw.spec
    console.print(f"[bold]vllm-sweep {__version__}[/bold]: sweep '{spec.name}' -> "
                  f"{sw.store.location}/ ({len(sw.space.parameters)} parameters, "
                  f"{spec.search.n_trials} trials, objective {spec.objective.direction} "
                  f"{spec.objective.metric})")
    with DriverSession(sw.store.sweep_dir / "driver.json") as driver, \
            RaySession(spec.cluster.address, spec.cluster.num_cpus,
                       spec.cluster.num_gpus) as session:
        _interrupt_on_signals()  # after ray.init, which installs its own handlers
        if driver.reaped_stale:
            console.print(f"ended {driver.reaped_stale} process(es) left by an earlier driver "
                          "of this sweep that died")
        console.print(f"Ray: {'private local instance' if session.is_local else 'joined existing cluster'}")
        host = spec.server.host
        if host == "auto":
            host = "127.0.0.1" if session.is_local else "node"
        sw, secret_env = _run_key(sw, session.is_local, host, args.no_api_key,
                                  lambda line: console.print(line, style="yellow",
                                                             highlight=False, soft_wrap=True))
        try:
            scale_up = find_scale_up(spec.cluster.autoscaling_config, joined=not session.is_local)
        except AutoscalingConfigError as exc:  # the head's bootstrap copy: the loader checked ours
            scale_up = None
            console.print(f"{exc} (ignored: trials must fit the nodes alive)", style="yellow",
                          highlight=False, soft_wrap=True)
        if scale_up is not None:
            console.print(scale_up.describe(), highlight=False, soft_wrap=True)
        launcher = RayLauncher(env=sweep_mod.server_env(spec, session.is_local), host=host,
                               engine=spec.engine, scale_up=scale_up,
                               secret_env=secret_env or None,
                               read_ahead=sweep_mod.read_ahead_dir(spec),
                               fork_start=(spec.engine == "gpu" and
                                           "fork_start" in spec.server.startup_levers),
                               warm_start=(spec.engine in ("cpu", "gpu") and
                                           "warm_start" in spec.server.startup_levers))
        try:
            left = launcher.clean_stale(driver.stale_session)
            if left:
                console.print(f"removed {len(left)} temp folder(s) left by runs that died: "
                              f"{', '.join(left)}", highlight=False, soft_wrap=True)
            if spec.cluster.shared_folder and may_prefill(sw.space):
                nodes = check_shared_folder(spec.cluster.shared_folder)
                console.print(f"cluster.shared_folder {spec.cluster.shared_folder}: one folder "
                              f"on all {nodes} node(s)", highlight=False, soft_wrap=True)
            runner = Runner(sw, launcher, console)
            runner.recover()  # a killed run's trials are closed before --add-trials counts
            target = max(runner.tuner.finished(), spec.search.n_trials)
            if args.add_trials:
                target = runner.tuner.finished() + args.add_trials
            runner.run(target)
        finally:
            launcher.close()
    runner.summary()
    console.print(f"results: {sw.store.location}", highlight=False, soft_wrap=True)
    return _decision_exit(sw, args.summary_json)


def _decision_exit(sw: Any, summary_json: str | None) -> int:
    """`run`'s ending (sw: the loaded sweep): the Decision JSON written to `summary_json` (if
    given); exit 0 when a configuration meets the SLA, else EXIT_NO_FEASIBLE."""
    from framework.results import decision as d

    found = d.sweep_decision(sw.store.read_trials(), sw.spec, sw.space, str(sw.path))
    if summary_json:
        d.write_summary_json(found, Path(summary_json))
    return 0 if found.feasible else d.EXIT_NO_FEASIBLE


def cmd_doctor(args: argparse.Namespace) -> int:
    import time
    import uuid

    from rich.console import Console

    from framework.cluster import RayLauncher
    from framework.cluster import RaySession
    from framework.cluster.driver_session import SESSION_VAR
    from framework.cluster.node_probe import probe_all_nodes
    from framework.sweep import doctor
    from framework.sweep import loader as sweep_mod

    console = Console(width=None if sys.stdout.isatty() else 160)
    t0 = time.monotonic()

    def say(text: str) -> None:
        elapsed = int(time.monotonic() - t0)
        console.print(f"[dim]{elapsed // 60:02d}:{elapsed % 60:02d}[/dim] {text}", highlight=False)

    sw = sweep_mod.load(Path(args.sweep))
    spec = sw.spec
    say(f"vllm-sweep doctor: sweep '{spec.name}' (engine {spec.engine}, model {spec.model})")
    os.environ[SESSION_VAR] = uuid.uuid4().hex  # servers carry it; a private Ray is reaped by it
    try:
        with RaySession(args.address or spec.cluster.address, spec.cluster.num_cpus,
                        spec.cluster.num_gpus) as session:
            _interrupt_on_signals()
            say("Ray: " + ("private local instance" if session.is_local
                           else "joined existing cluster"))
            host = spec.server.host
            if host == "auto":
                host = "127.0.0.1" if session.is_local else "node"
            sw, secret_env = _run_key(sw, session.is_local, host, args.no_api_key, say)
            launcher = RayLauncher(env=sweep_mod.server_env(spec, session.is_local), host=host,
                                   engine=spec.engine, placement_timeout_s=300.0,
                                   secret_env=secret_env or None)
            try:
                checks = doctor.run(sw, session.is_local, host, launcher, probe_all_nodes, say)
            finally:
                launcher.close()  # the run folder on each node it used
    finally:
        os.environ.pop(SESSION_VAR, None)
    console.print(doctor.table(checks))
    return doctor.exit_code(checks, EXIT_CLUSTER)


def cmd_bench(args: argparse.Namespace) -> int:
    from framework.load.bench import run

    return run(args)




def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vllm-sweep",
        description="Find the best vLLM serving configuration for a model, a workload and an "
        "SLA: a search over vLLM's flags, each trial a real server under load.",
        epilog="Exit codes: 0 success; 1 `best` or `export` has nothing to print (no results yet, or no "
        "feasible trial); 2 bad input (one line naming file, key and value); 3 cluster problem "
        "(or another driver runs the sweep, the results' object store cannot be read or written, "
        "or a `doctor` check failed); 4 `run` ended and no "
        "configuration meets the SLA; 130 interrupted.")
    p.add_argument("--version", action="version", version=f"vllm-sweep {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           help="one of the commands below; `vllm-sweep COMMAND --help` "
                           "lists its arguments")
    run = sub.add_parser("run", help="run (or resume) a sweep")
    run.add_argument("sweep", help=SWEEP_HELP)
    run.add_argument("--add-trials", type=int, default=0, metavar="N",
                     help="run N trials beyond those the study already holds")
    run.add_argument("--summary-json", default=None, metavar="FILE",
                     help="write the decision as JSON to FILE at the end: verdict, best "
                     "configuration (flags, serve command), gain interval, fleet and cost "
                     "(docs/RESULTS.md); exit 4 when no configuration meets the SLA")
    run.add_argument("--no-api-key", action="store_true", help=NO_API_KEY_HELP)
    run.set_defaults(fn=cmd_run)
    from framework.sweep import job_cli
    from framework.sweep import plan_cli
    from framework.sweep import results_cli
    from framework.sweep import setup_cli

    job_cli.add_submit_parser(sub, SWEEP_HELP)
    plan_cli.add_parsers(sub, SWEEP_HELP)
    results_cli.add_parsers(sub, SWEEP_HELP)
    dr = sub.add_parser(
        "doctor", help="check the cluster before a sweep: GPUs, versions, cache and results "
        "dirs, ports on every node, then short real servers (exit 3 on any failure)",
        description="Checks every alive Ray node (GPUs and memory; vLLM, torch, CUDA, Ray "
        "versions equal across nodes; the cache dir writable; free server ports) and the "
        "results dir, then starts one short TP=1 server per GPU type (CPU engine: one CPU "
        "server) and TP=2 / PP=2 servers where the cluster has room, 20 requests each, as a "
        "sweep would. Prints one table; exit 0 when nothing failed, 3 otherwise.")
    dr.add_argument("sweep", nargs="?", default="sweeps/quickstart.yaml",
                    help="sweep YAML giving model, engine, server args, cache and results dirs "
                    "(default: sweeps/quickstart.yaml)")
    dr.add_argument("--address", default=None, metavar="ADDR",
                    help="join this Ray cluster (default: the sweep's cluster.address, else "
                    "RAY_ADDRESS, else a private local Ray)")
    dr.add_argument("--no-api-key", action="store_true", help=NO_API_KEY_HELP)
    dr.set_defaults(fn=cmd_doctor)
    setup_cli.add_parsers(sub)
    # issue #20: export / compare (arguments and work in framework/sweep/deploy_cli.py)
    from framework.sweep import deploy_cli

    ex = sub.add_parser("export", help="the shipped configuration for a deployment path: "
                        "serve, json, ray-serve or k8s (exit 1 when nothing ships)")
    deploy_cli.add_export_args(ex)
    ex.set_defaults(fn=deploy_cli.cmd_export)
    cp = sub.add_parser("compare", help="sweeps of one model and workload on different hardware "
                        "side by side; the cheapest way to serve the target within the SLA")
    deploy_cli.add_compare_args(cp)
    cp.set_defaults(fn=deploy_cli.cmd_compare)
    from framework.load.bench_args import add_cli_args as add_bench_args  # no vLLM, no transformers

    be = sub.add_parser("bench", help="benchmark one OpenAI-compatible server like "
                        "`vllm bench serve` (same flags, same JSON keys)")
    add_bench_args(be)
    be.set_defaults(fn=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (ClusterError, StoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CLUSTER
    except KeyboardInterrupt:
        print("interrupted: servers stopped; results so far are in place", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
