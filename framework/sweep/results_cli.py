"""`status`, `best`, `compact` and `report`: what a sweep's stored results say, read without
Ray or vLLM. Their arguments (`add_parsers`) and their work, so cli.py only registers them.

Exit codes as cli.py's: 1 when `best` has nothing to print, 2 bad input (`report` of a sweep
without results, a bad --rows-per-file), 3 when `compact` finds the sweep's driver running."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from framework.base.exit_codes import EXIT_BAD_INPUT
from framework.base.exit_codes import EXIT_CLUSTER

if TYPE_CHECKING:
    from framework.config.specs import SweepSpec


def stored(args: argparse.Namespace):
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

    sw, trials = stored(args)
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

    sw, trials = stored(args)
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

    sw, trials = stored(args)
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


def add_parsers(sub: Any, sweep_help: str) -> None:
    """Register status, compact, best and report on the `vllm-sweep` subparsers `sub`."""
    st = sub.add_parser("status", help="progress of a running, finished or killed sweep, from "
                        "its stored results")
    st.add_argument("sweep", help=sweep_help)
    st.set_defaults(fn=cmd_status)
    co = sub.add_parser("compact", help="merge a finished sweep's per-trial files into a few "
                        "large ones (faster queries over thousands of trials)")
    co.add_argument("sweep", help=sweep_help)
    co.add_argument("--rows-per-file", type=int, default=4_000_000, metavar="N",
                    help="at most N rows per merged file (default 4,000,000)")
    co.set_defaults(fn=cmd_compact)
    be_ = sub.add_parser("best", help="the best feasible configuration as a `vllm serve` "
                         "command or as YAML",
                         description="Prints the best feasible configuration on stdout and its "
                         "trial, objective value and gain over the baseline on stderr. Exit 1 "
                         "when the sweep has no results yet or no feasible trial.")
    be_.add_argument("sweep", help=sweep_help)
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
    rep.add_argument("sweep", help=sweep_help)
    rep.add_argument("--out", default=None, metavar="PATH",
                     help="HTML file to write (default: <results_dir>/<sweep>/report.html)")
    rep.set_defaults(fn=cmd_report)
