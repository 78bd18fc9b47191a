"""`validate` and `plan`: a sweep checked, and its space sized and timed, before anything starts
(no Ray, no server). Their arguments (`add_parsers`) and their work, so cli.py only registers
them. Bad input is a ConfigError (cli.py: exit 2)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from framework.base.errors import ConfigError
from framework.sweep.results_cli import stored

if TYPE_CHECKING:
    from framework.base.vocabulary import Scalar


def _curve_text(sw: Any) -> str:
    """'; <setting> measured as a curve ... at v1, v2' for a sweep whose searched load setting
    became one workload per value (sweep.load_curve), else ''."""
    from framework.sweep.load_curve import curve_values

    if sw.load_curve is None:
        return ""
    values = curve_values(sw.spec, sw.load_curve)
    return f"; {sw.load_curve} measured as a curve of each configuration at {', '.join(values)}"


def cmd_plan(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from framework.config.search_space import configurations
    from framework.results.queries import phase_means
    from framework.sweep import loader as sweep_mod
    from framework.sweep import plan

    sw, trials = stored(args)
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


def add_parsers(sub: Any, sweep_help: str) -> None:
    """Register validate and plan on the `vllm-sweep` subparsers `sub`."""
    val = sub.add_parser("validate", help="check a sweep and its search space; start nothing")
    val.add_argument("sweep", help=sweep_help)
    val.set_defaults(fn=cmd_validate)
    pl = sub.add_parser("plan", help="size of the space, the share the feasibility model "
                        "lets through, and the expected wall time; starts nothing")
    pl.add_argument("sweep", help=sweep_help)
    pl.add_argument("--gpus", type=int, default=None, metavar="N",
                    help="GPUs of the target cluster (bounds TP x PP in the feasibility model)")
    pl.add_argument("--side-by-side", type=int, default=1, metavar="K",
                    help="trials expected to run at once on a GPU cluster (default 1)")
    pl.set_defaults(fn=cmd_plan)
