"""`export` and `compare`: from stored results to a deployment decision (issue #20). Their
arguments (`add_*_args`) and their work, so cli.py only registers them.

Exit codes as cli.py's: 1 when a sweep has nothing to export (no results, no feasible
configuration), 2 bad input (ConfigError)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import yaml

from framework.base.errors import ConfigError
from framework.base.exit_codes import EXIT_NOTHING
from framework.fleet.columns import Target

FORMATS = ("serve", "json", "ray-serve", "k8s")


def add_export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("sweep", help="sweep YAML file (e.g. sweeps/quickstart.yaml)")
    p.add_argument("--format", required=True, metavar="F",
                   help=f"one of {', '.join(FORMATS)}: the `vllm serve` command; JSON for "
                   "pipelines (flags, verdict, gain interval, fleet); a Ray Serve LLM `serve "
                   "run` config; a Kubernetes Deployment + Service")
    p.add_argument("-o", "--out", default=None, metavar="FILE",
                   help="write to FILE instead of stdout")
    p.add_argument("--image", default=None, metavar="IMAGE",
                   help="k8s: container image (default vllm/vllm-openai:v<the sweep's vLLM>)")


def add_compare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("sweeps", nargs="+", metavar="SWEEP",
                   help="sweeps of one model and workload on different hardware: their YAML "
                   "files or their results directories (results/<sweep>)")
    p.add_argument("--target", type=float, default=None, metavar="RPS",
                   help="requests/s the fleet must carry (default: the sweeps' target:)")
    p.add_argument("--allow-different", action="store_true",
                   help="compare even when model, workload, objective, SLA or target differ "
                   "(each difference is printed as a warning)")


def _stored(path: str):
    """A sweep and its trial rows, from its YAML file or from its results directory (whose
    origin.json names the sweep file and the directory it ran from: its relative paths are
    read from there)."""
    from framework.results.store import read_origin
    from framework.sweep import loader as sweep_mod

    where = Path(path)
    if not where.is_dir():
        sw = sweep_mod.load(where, check_flags=False)
        return sw, sw.store.read_trials()
    origin = read_origin(where)
    if origin is None:
        raise ConfigError(path, "(results directory)", path, "no origin.json here: give the sweep "
                          "file, or a results directory written by `vllm-sweep run`")
    sweep_file, cwd = origin
    if not sweep_file.is_file() or not cwd.is_dir():
        raise ConfigError(path, "origin.json", str(sweep_file), "the sweep file it ran from is "
                          "gone; give the sweep file instead")
    with contextlib.chdir(cwd):
        sw = sweep_mod.load(sweep_file, check_flags=False)
        return sw, sw.store.read_trials()


def _image(version: object) -> str:
    """vLLM's OpenAI server image at the sweep's vLLM version (a local `+cpu` tag dropped)."""
    text = str(version or "").split("+", 1)[0]
    return f"vllm/vllm-openai:v{text}" if text and text != "None" else "vllm/vllm-openai:latest"


def cmd_export(args: argparse.Namespace) -> int:
    from framework.fleet.manifests import k8s_manifests
    from framework.fleet.manifests import ray_serve_app
    from framework.results import deploy

    if args.format not in FORMATS:
        raise ConfigError("command line", "--format", args.format, f"expected one of {', '.join(FORMATS)}")
    sw, trials = _stored(args.sweep)
    if trials.empty:
        print(f"no results for sweep {sw.spec.name} in {sw.store.sweep_dir}", file=sys.stderr)
        return EXIT_NOTHING
    found = deploy.shipped(trials, sw.spec, list(sw.space.parameters), sw.space.run_params,
                           target=sw.target, price_of=sw.price)
    if not isinstance(found, deploy.Shipped):
        print(found.headline, file=sys.stderr)
        return EXIT_NOTHING
    version = trials.loc[trials["trial_number"] == found.trial, "vllm_version"].iloc[0]
    plan = deploy.deployment(found, args.image or _image(version))
    if args.format == "serve":
        text = found.serve_command + "\n"
    elif args.format == "json":
        text = json.dumps(deploy.as_json(found), indent=2) + "\n"
    elif args.format == "ray-serve":
        from framework.cluster.serve_llm import check_ray_serve_config

        doc = ray_serve_app(plan)
        check_ray_serve_config(doc)
        text = yaml.safe_dump(doc, sort_keys=False)
    else:
        text = yaml.safe_dump_all(k8s_manifests(plan), sort_keys=False)
    print(f"trial {found.trial} [{found.verdict.kind}]: {found.verdict.headline}", file=sys.stderr)
    if args.out:
        try:
            Path(args.out).write_text(text)
        except OSError as exc:
            raise ConfigError("command line", "-o", args.out, exc.strerror or str(exc)) from exc
        print(f"{args.out}: {args.format}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from framework.results import deploy
    from framework.results.compare import Entry
    from framework.results.compare import digests
    from framework.results.compare import problems
    from framework.results.compare import report_lines

    entries: list[Entry] = []
    for path in args.sweeps:
        sw, trials = _stored(path)
        if trials.empty:
            raise ConfigError(path, "results_dir", str(sw.store.sweep_dir), "no results to compare")
        target = sw.target if args.target is None else Target(
            args.target, sw.spec.target.headroom if sw.spec.target else 0.0)
        found = deploy.shipped(trials, sw.spec, list(sw.space.parameters), sw.space.run_params,
                               target=target, price_of=sw.price)
        if isinstance(found, deploy.Shipped):
            entries.append(Entry(sw.spec, found, found.verdict, *digests(trials)))
        else:
            entries.append(Entry(sw.spec, None, found, *digests(trials)))
    differ = problems(entries, check_target=args.target is None)
    if differ and not args.allow_different:
        raise ConfigError(" vs ".join(args.sweeps), "compare", "", "; ".join(differ)
                          + " (--allow-different compares them anyway)")
    for text in differ:
        print(f"warning: {text}", file=sys.stderr)
    has_target = args.target is not None or any(e.spec.target for e in entries)
    print("\n".join(report_lines(entries, has_target)))
    return 0
