"""`vllm-sweep` command line: thin argument parsing over the modules below.

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
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from framework import __version__
from framework.base.errors import ClusterError
from framework.base.errors import ConfigError
from framework.base.errors import StoreError
from framework.base.exit_codes import EXIT_BAD_INPUT
from framework.base.exit_codes import EXIT_CLUSTER
from framework.base.exit_codes import EXIT_INTERRUPTED

if TYPE_CHECKING:
    from framework.base.vocabulary import Scalar
    from framework.config.specs import SweepSpec

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


def _curve_text(sw: Any) -> str:
    """'; <setting> measured as a curve ... at v1, v2' for a sweep whose searched load setting
    became one workload per value (sweep.load_curve), else ''."""
    from framework.sweep.load_curve import curve_values

    if sw.load_curve is None:
        return ""
    values = curve_values(sw.spec, sw.load_curve)
    return f"; {sw.load_curve} measured as a curve of each configuration at {', '.join(values)}"


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


def _stored(args: argparse.Namespace):
    """The sweep (files checked, vLLM not imported) and its trial rows."""
    from framework.sweep import loader as sweep_mod

    sw = sweep_mod.load(Path(args.sweep), check_flags=False)
    return sw, sw.store.read_trials()


def cmd_compact(args: argparse.Namespace) -> int:
    """Merge a sweep's per-trial files into large parts (results.compaction); refused while the
    sweep's driver runs (exit 3)."""
    from framework.results.compaction import compact
    from framework.results.status import live_driver
    from framework.results.store import open_store
    from framework.sweep import loader as sweep_mod

    if args.rows_per_file < 1:
        print(f"error: --rows-per-file must be >= 1, got {args.rows_per_file}", file=sys.stderr)
        return EXIT_BAD_INPUT
    spec = sweep_mod.load(Path(args.sweep), check_flags=False).spec
    store = open_store(spec.results_dir, spec.name, full=True)  # every row, to merge
    if (pid := live_driver(store.sweep_dir / "driver.json")) is not None:
        print(f"error: the sweep's driver (pid {pid}) is running; compact once it has ended",
              file=sys.stderr)
        return EXIT_CLUSTER
    done = compact(store, args.rows_per_file)
    for c in done:
        print(f"{c.table}: {c.files} per-trial files -> {c.parts} part(s), {c.rows} rows")
    print(f"{'compacted' if done else 'nothing to compact'}: {store.location}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from framework.results.status import live_driver
    from framework.results.status import sweep_status

    sw, trials = _stored(args)
    spec = sw.spec
    status = sweep_status(trials, spec.search.n_trials,
                          spec.objective.direction == "maximize", spec.concurrent_trials or 1,
                          live_driver(sw.store.sweep_dir / "driver.json"), spec.objective.metric,
                          spec.sla)
    print("\n".join(status.lines(spec.name, spec.objective.metric)))
    if trials.empty:
        print(f"  no results yet in {sw.store.location}")
    return 0


def cmd_best(args: argparse.Namespace) -> int:
    """The configuration to ship on stdout (a `vllm serve` command or YAML): the verdict's
    winner, or vLLM's defaults when nothing beat them beyond the noise (results.verdict); on
    stderr the trial, its value and the verdict with its interval, so `$(vllm-sweep best ...)`
    is the command alone. Exit 1 when there is nothing to ship."""
    from framework.results.status import best_as_yaml
    from framework.results.status import verdict_text
    from framework.results.verdict import decide

    sw, trials = _stored(args)
    spec, params = sw.spec, list(sw.space.parameters)
    maximize = spec.objective.direction == "maximize"
    if trials.empty:
        print(f"no results for sweep {spec.name} in {sw.store.location}", file=sys.stderr)
        return 1
    if args.pareto:
        return _print_pareto(spec, trials)
    verdict = decide(trials, spec.objective.metric, maximize, spec.sla)
    print(verdict_text(trials, verdict, spec.objective.metric), file=sys.stderr)
    if verdict.ship is None:
        return 1
    if args.format == "json":  # the Decision, as `run --summary-json` writes it
        from framework.results.decision import summary_json
        from framework.results.decision import sweep_decision

        text = summary_json(sweep_decision(trials, spec, sw.space, args.sweep))
    elif args.format == "yaml":
        text = best_as_yaml(trials, verdict, params, dict(spec.server.args), str(spec.model),
                            sw.space.run_params)
    else:
        row = trials[trials["trial_number"] == verdict.ship].iloc[0]
        text = str(row["serve_command"])
    print(text.rstrip())
    return 0


def _print_pareto(spec: SweepSpec, trials: Any) -> int:  # trials: a pandas DataFrame (results/ owns pandas)
    from framework.base.vocabulary import with_unit
    from framework.results.status import pareto_trials

    metrics = list(spec.objective.metrics)
    front = pareto_trials(trials, metrics, list(spec.objective.directions))
    if front.empty:
        print(f"{spec.name}: no feasible trial yet", file=sys.stderr)
        return 1
    print(f"Pareto front of {', '.join(metrics)} ({len(front)} feasible trials):")
    for _, row in front.iterrows():
        values = "  ".join(f"{m}={with_unit(m, float(row[m]))}" for m in metrics)
        print(f"trial {int(row['trial_number'])}: {values}\n  {row['serve_command']}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from framework.results.html_report import render_report
    from framework.results.queries import cut_short_mask
    from framework.search.tuner import param_importances

    sw, trials = _stored(args)
    if trials.empty:
        print(f"error: sweep '{sw.spec.name}' has no results yet in {sw.store.location}",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    # a load stopped early measured a fraction of the requests: its value is not the
    # configuration's, so it does not rank the parameters either
    early = [int(n) for n in trials[cut_short_mask(trials)]["trial_number"]]
    importances = param_importances(sw.spec.search.storage or sw.store.journal_path, sw.spec.name,
                                    exclude=early)
    out = Path(args.out) if args.out else sw.store.sweep_dir / "report.html"
    render_report(trials, sw.spec, importances, out, space=sw.space, sweep_file=args.sweep,
                  workloads=sw.store.read_workloads())
    if not args.out:
        sw.store.publish(out)  # an object store's results: the report beside them
    print(out if args.out else sw.store.where(out))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from framework.config.search_space import configurations
    from framework.results.queries import phase_means
    from framework.sweep import loader as sweep_mod
    from framework.sweep import plan

    sw, trials = _stored(args)
    spec, space = sw.spec, sw.space
    size = plan.space_size(space)
    exhaustive = size is not None and size <= plan.ENUMERATE_LIMIT
    configs = (list(configurations(space)) if exhaustive
               else plan.sample(space, plan.SAMPLE_SIZE, spec.search.seed))

    def check(params: Mapping[str, Scalar]):
        from framework.engine.server_args import trial_flags

        return sweep_mod.feasibility(sw, trial_flags(spec.server.args, space.server_params(params),
                                                     False), args.gpus)

    share = plan.feasible_share(configs, exhaustive, check)
    side = spec.concurrent_trials or args.side_by_side
    estimate = plan.time_estimate(phase_means(trials), spec.engine, spec.search.n_trials, side,
                                  loads=max(1, len(spec.workloads)),
                                  runs_per_server=plan.runs_per_server(space, spec.search.sampler)
                                  if spec.server.reuse else 1, screen=spec.search.screen,
                                  start_ahead=spec.cluster.start_ahead,
                                  remeasured=plan.remeasurements(
                                      spec.search.confirm_top, spec.search.baseline,
                                      spec.search.baseline_repeats,
                                      spec.search.interleaved_runs
                                      if spec.search.sampler == "grid" else 0),
                                  warm="warm_start" in spec.server.startup_levers
                                  and spec.engine in ("cpu", "gpu"))
    if space.shape_params:
        estimate = replace(estimate, servers=plan.servers_per_trial(configs))
    print(f"sweep {spec.name}: {len(space.parameters)} parameters, "
          f"{'unbounded (float ranges)' if size is None else f'{size} configurations'}"
          f"{_curve_text(sw)}")
    if share is None:
        print("  feasibility: no memory model for this sweep (GPU sweeps: set `gpu:`)")
    else:
        how = "all" if share.exhaustive else f"{share.checked} sampled"
        print(f"  feasibility model: {share.feasible} of {how} configurations pass "
              f"({100 * share.feasible / max(1, share.checked):.0f}%)"
              + (f" with {args.gpus} GPUs" if args.gpus else ""))
        for reason, count in share.top_reasons:
            print(f"    ruled out {count}x: {reason}")
    print("\n".join(estimate.lines()))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from framework.sweep import loader as sweep_mod

    sw = sweep_mod.load(Path(args.sweep))
    print(f"{args.sweep}: ok (sweep '{sw.spec.name}', {len(sw.space.parameters)} parameters"
          f"{_curve_text(sw)})")
    try:
        sweep_mod.check_tokenizer(sw)
    except ConfigError as exc:
        print(f"note: `run` needs a tokenizer: {exc}")
    if sw.spec.search.prior is not None:
        from framework.sweep.prior import off_reason

        reason = off_reason(sw)
        print(f"search.prior {sw.spec.search.prior}: " + (f"off: {reason}" if reason else
                                                           f"on (GPU {sw.spec.gpu})"))
    return 0


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
    from framework.sweep import setup_cli

    job_cli.add_submit_parser(sub, SWEEP_HELP)
    val = sub.add_parser("validate", help="check a sweep and its search space; start nothing")
    val.add_argument("sweep", help=SWEEP_HELP)
    val.set_defaults(fn=cmd_validate)
    st = sub.add_parser("status", help="progress of a running, finished or killed sweep, from "
                        "its stored results")
    st.add_argument("sweep", help=SWEEP_HELP)
    st.set_defaults(fn=cmd_status)
    co = sub.add_parser("compact", help="merge a finished sweep's per-trial files into a few "
                        "large ones (faster queries over thousands of trials)")
    co.add_argument("sweep", help=SWEEP_HELP)
    co.add_argument("--rows-per-file", type=int, default=4_000_000, metavar="N",
                    help="at most N rows per merged file (default 4,000,000)")
    co.set_defaults(fn=cmd_compact)
    be_ = sub.add_parser("best", help="the best feasible configuration as a `vllm serve` "
                         "command or as YAML",
                         description="Prints the best feasible configuration on stdout and its "
                         "trial, objective value and gain over the baseline on stderr. Exit 1 "
                         "when the sweep has no results yet or no feasible trial.")
    be_.add_argument("sweep", help=SWEEP_HELP)
    be_.add_argument("--format", choices=("command", "yaml", "json"), default="command",
                     help="command: a pasteable `vllm serve` line; yaml: the trial, objective, "
                     "every flag and run setting; json: the decision as `run --summary-json` "
                     "writes it, with the fleet and its cost (default: command)")
    be_.add_argument("--pareto", action="store_true",
                     help="every feasible trial on the Pareto front of the objective and "
                     "objective.pareto_with metrics")
    be_.set_defaults(fn=cmd_best)
    rep = sub.add_parser("report", help="write the sweep's HTML report (plots, all trials, "
                         "diagnosis, failures) from its stored results")
    rep.add_argument("sweep", help=SWEEP_HELP)
    rep.add_argument("--out", default=None, metavar="PATH",
                     help="HTML file to write (default: <results_dir>/<sweep>/report.html)")
    rep.set_defaults(fn=cmd_report)
    pl = sub.add_parser("plan", help="size of the space, the share the feasibility model "
                        "lets through, and the expected wall time; starts nothing")
    pl.add_argument("sweep", help=SWEEP_HELP)
    pl.add_argument("--gpus", type=int, default=None, metavar="N",
                    help="GPUs of the target cluster (bounds TP x PP in the feasibility model)")
    pl.add_argument("--side-by-side", type=int, default=1, metavar="K",
                    help="trials expected to run at once on a GPU cluster (default 1)")
    pl.set_defaults(fn=cmd_plan)
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
