"""`vllm-sweep submit`: a sweep as a Ray job run in place (framework/sweep/job_dir.py), its
arguments and its work; framework/cli.py only registers it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from framework.base.exit_codes import EXIT_CLUSTER
from framework.base.exit_codes import EXIT_INTERRUPTED

if TYPE_CHECKING:
    from framework.config.specs import SweepSpec


def job_servers(spec: SweepSpec, add_trials: int) -> int:
    """The most servers the job's driver may hold at once (its clean stop ends each): the cap
    on trials side by side (SweepSpec.concurrent_trials; without one, the trials the run
    asks for), doubled with server.reuse (a measured server parked beside each running trial),
    never more than those trials."""
    trials = add_trials or spec.search.n_trials
    cap = spec.concurrent_trials or trials
    return max(1, min(trials, cap * (2 if spec.server.reuse else 1)))


def cmd_submit(args: argparse.Namespace) -> int:
    import shlex

    from framework.cluster.jobs import follow
    from framework.cluster.jobs import stop_wait_s
    from framework.cluster.jobs import submit
    from framework.results.object_store import join_uri
    from framework.sweep import loader as sweep_mod
    from framework.sweep.job_dir import in_place_working_dir
    from framework.sweep.job_dir import results_place

    sw = sweep_mod.load(Path(args.sweep), check_flags=False)  # the job's `run` checks the rest
    cwd = Path.cwd()
    place = (results_place(sw.spec.results_dir, sw.spec.name, cwd)
             if isinstance(sw.spec.results_dir, Path) else join_uri(sw.spec.results_dir, sw.spec.name))
    entrypoint = shlex.join(["vllm-sweep", "run", args.sweep]
                            + (["--add-trials", str(args.add_trials)] if args.add_trials else [])
                            + (["--no-api-key"] if args.no_api_key else []))
    stop_wait = stop_wait_s(job_servers(sw.spec, args.add_trials))
    job_id = submit(args.address, entrypoint, in_place_working_dir(cwd), args.submission_id,
                    stop_wait)
    print(f"job {job_id}: `{entrypoint}` in {cwd} on the cluster's nodes (`ray job stop` "
          f"waits {stop_wait} s for its clean stop); results: {place}", flush=True)
    if args.no_wait:
        return 0
    try:
        end = follow(args.address, job_id, lambda text: print(text, end="", flush=True))
    except KeyboardInterrupt:
        print(f"stopped following; job {job_id} runs on (`ray job stop {job_id}` ends it)",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"job {job_id}: {end.status} (exit code {end.exit_code}); results: {place}")
    return 0 if end.succeeded else (end.exit_code or EXIT_CLUSTER)


def add_submit_parser(sub: Any, sweep_help: str) -> None:
    sm = sub.add_parser(
        "submit", help="run a sweep as a Ray job on a cluster, in this directory on every node",
        description="Submits `vllm-sweep run SWEEP` through Ray's job API with this directory "
        "as the job's in-place working dir (`local://$PWD`: nothing uploaded, so paths resolve "
        "as for `run`; the directory must be readable at the same path on every node: one "
        "machine or shared storage), prints where the results go, follows the job's log and "
        "exits with the job's exit code. `ray job stop` then waits 15 s + 20 s per server the "
        "sweep may hold before its SIGKILL (RAY_JOB_STOP_WAIT_TIME_S; Ray's default is 3 s), "
        "so the driver stops every server cleanly.")
    sm.add_argument("sweep", help=sweep_help)
    sm.add_argument("--address", default=None, metavar="URL",
                    help="the Ray dashboard, e.g. http://127.0.0.1:8265 (default: RAY_ADDRESS, "
                    "else the local cluster's)")
    sm.add_argument("--submission-id", default=None, metavar="ID", help="the job's id")
    sm.add_argument("--add-trials", type=int, default=0, metavar="N",
                    help="as for `run`: N trials beyond those the study already holds")
    sm.add_argument("--no-api-key", action="store_true",
                    help="as for `run`: servers without the random per-run API key a joined "
                    "cluster's servers get by default (one warning line)")
    sm.add_argument("--no-wait", action="store_true",
                    help="return once submitted (follow with `ray job logs -f ID`)")
    sm.set_defaults(fn=cmd_submit)
