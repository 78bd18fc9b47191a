"""`export` and `compare`: from stored results to a deployment decision (issue #20). Their
arguments (`add_*_args`) and their work, so cli.py only registers them.

Exit codes as cli.py's: 1 when a sweep has nothing to export (no results, no feasible
configuration), 2 bad input (ConfigError)."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from framework.base.errors import ConfigError
from framework.base.exit_codes import EXIT_NOTHING
from framework.fleet.columns import Target
from framework.fleet.manifests import API_KEY_SECRET
from framework.fleet.manifests import API_KEY_SECRET_KEY
from framework.fleet.manifests import HF_TOKEN_SECRET
from framework.fleet.manifests import HF_TOKEN_SECRET_KEY
from framework.fleet.manifests import MODEL_CLAIM
from framework.fleet.manifests import MODEL_MOUNT

if TYPE_CHECKING:
    from framework.config.specs import SweepSpec
    from framework.fleet.manifests import ModelSource
    from framework.results.deploy import Shipped
    from framework.sweep.loader import Sweep

FORMATS = ("serve", "json", "ray-serve", "k8s")


def add_export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("sweep", help="sweep YAML file (e.g. sweeps/quickstart.yaml)")
    p.add_argument("--format", required=True, metavar="F",
                   help=f"one of {', '.join(FORMATS)}: the `vllm serve` command; JSON for "
                   "pipelines (flags, verdict, gain interval, fleet); a Ray Serve LLM `serve "
                   "run` config; a Kubernetes Deployment + Service")
    p.add_argument("-o", "--out", default=None, metavar="FILE",
                   help="write to FILE instead of stdout")
    k8s = p.add_argument_group("k8s", "the Kubernetes manifests (README, 'From the best "
                               "configuration to a deployment')")
    k8s.add_argument("--image", default=None, metavar="IMAGE",
                     help="container image, pinned by a tag or digest (default: vLLM's published "
                     "image at the sweep's vLLM version: vllm/vllm-openai:vX on GPU, "
                     "vllm/vllm-openai-cpu:vX-x86_64 on CPU)")
    k8s.add_argument("--api-key-secret", default=None, metavar="NAME",
                     help=f"Secret holding VLLM_API_KEY under key {API_KEY_SECRET_KEY!r} "
                     f"(default {API_KEY_SECRET} when the sweep set server.api_key_env; naming "
                     "one adds the key to a sweep that ran without)")
    k8s.add_argument("--model-id", default=None, metavar="REPO",
                     help="serve this Hugging Face hub id (HF_TOKEN from --hf-token-secret, "
                     "optional) instead of the sweep's local model folder")
    k8s.add_argument("--model-volume", default=None, metavar="CLAIM[:PATH]",
                     help="PersistentVolumeClaim holding the model, mounted read-only at "
                     f"{MODEL_MOUNT}, the model folder at PATH inside it (default: the "
                     f"sweep's folder name). Default for a local model: {MODEL_CLAIM}; a folder "
                     "of Hugging Face's hub cache is served by its hub id and revision instead")
    k8s.add_argument("--hf-token-secret", default=HF_TOKEN_SECRET, metavar="NAME",
                     help=f"Secret holding HF_TOKEN under key {HF_TOKEN_SECRET_KEY!r}, for a "
                     f"hub model (default {HF_TOKEN_SECRET}; optional: public models need none)")


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


_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
# the servers' environment a deployment keeps (sweep.loader.server_env); the sweep's own
# cache and Ray settings stay behind, offline mode follows where the model comes from
_SERVED_ENV = ("VLLM_NO_USAGE_STATS", "DO_NOT_TRACK", "VLLM_CPU_KVCACHE_SPACE")


def _image(engine: str, version: object, given: str | None) -> str:
    """`--image` when pinned, else vLLM's published image at the sweep's vLLM version (the
    rows', else the installed one); never an unpinned image."""
    from framework.engine.flag_cache import vllm_version
    from framework.fleet.manifests import image_for
    from framework.fleet.manifests import image_problem

    if given is not None:
        if problem := image_problem(given):
            raise ConfigError("command line", "--image", given, problem)
        return given
    known = None if version is None or str(version) in ("", "None", "nan", "<NA>") else str(version)
    try:
        return image_for(engine, known or vllm_version())
    except ValueError as exc:
        raise ConfigError("command line", "--image", "", str(exc)) from None


def _k8s_name(option: str, name: str) -> str:
    if not _DNS_SUBDOMAIN.fullmatch(name):
        raise ConfigError("command line", option, name, "a Kubernetes object name: lower case "
                          "letters, digits, '-' and '.', starting and ending alphanumeric")
    return name


def _model_source(args: argparse.Namespace, model: Path) -> ModelSource:
    """Where the pods read the model (fleet.manifests.model_source) from --model-id and
    --model-volume."""
    from framework.fleet.manifests import HubModel
    from framework.fleet.manifests import model_source

    if args.model_id is not None and args.model_volume is not None:
        raise ConfigError("command line", "--model-id", args.model_id, "give --model-id or "
                          "--model-volume, not both")
    if args.model_id is not None and not _REPO_ID.fullmatch(args.model_id):
        raise ConfigError("command line", "--model-id", args.model_id, "a Hugging Face hub id "
                          "(ORG/NAME)")
    claim = path = None
    if args.model_volume is not None:
        claim, _, inside = args.model_volume.partition(":")
        _k8s_name("--model-volume", claim)
        path = inside or None
        if path is not None and (path.startswith("/") or ".." in path.split("/")):
            raise ConfigError("command line", "--model-volume", args.model_volume,
                              "PATH is a folder inside the claim: relative, without '..'")
    source = model_source(str(model.resolve()), repo_id=args.model_id, claim=claim, path=path)
    if isinstance(source, HubModel):
        source = HubModel(source.repo_id, source.revision,
                          _k8s_name("--hf-token-secret", args.hf_token_secret))
    return source


def _served_env(spec: SweepSpec) -> dict[str, str]:
    """The environment the sweep's servers ran with that a deployment keeps: usage stats off,
    the CPU engine's KV cache space, and the sweep's server.env (secrets are refused there)."""
    from framework.sweep.loader import server_env

    env = server_env(spec)
    return {**{k: env[k] for k in _SERVED_ENV if k in env}, **spec.server.env}


def _ran_from(path: str) -> Path:
    """The directory a sweep's relative paths are read from: a results directory's origin
    (as _stored loads it), else the current one."""
    from framework.results.store import read_origin

    where = Path(path)
    origin = read_origin(where) if where.is_dir() else None
    return origin[1] if origin is not None else Path.cwd()


def _k8s_text(sw: Sweep, found: Shipped, version: object, args: argparse.Namespace) -> str:
    """The Deployment and Service as YAML, after comment lines saying what they need."""
    from framework.fleet.manifests import HubModel
    from framework.fleet.manifests import k8s_manifests
    from framework.fleet.manifests import k8s_notes
    from framework.results import deploy

    image = _image(found.engine, version, args.image)
    model = _ran_from(args.sweep) / sw.spec.model  # an absolute model path stays itself
    source = _model_source(args, model)
    secret = args.api_key_secret or (API_KEY_SECRET if sw.spec.server.api_key_env else None)
    env = _served_env(sw.spec)
    kv = float(env.get("VLLM_CPU_KVCACHE_SPACE", "0") or 0) if found.engine == "cpu" else 0.0
    size = deploy.size_of(found, deploy.weights_bytes(model, found.flags),
                          kv_space_gib=kv, from_hub=isinstance(source, HubModel))
    plan = deploy.deployment(found, image, source=source,
                             api_key_secret=secret and _k8s_name("--api-key-secret", secret),
                             env=env, size=size)
    head = [f"vllm-sweep export {sw.spec.name}: trial {found.trial} ({found.verdict.kind})",
            *k8s_notes(plan)]
    docs = k8s_manifests(plan)
    if found.prefill:
        from framework.engine.router_source import standalone_files
        from framework.fleet.k8s_pd import pd_manifests
        from framework.fleet.k8s_pd import pd_notes

        head += pd_notes(plan)
        docs = pd_manifests(plan, standalone_files())
    return "".join(f"# {line}\n" for line in head) + yaml.safe_dump_all(docs, sort_keys=False)


def cmd_export(args: argparse.Namespace) -> int:
    from framework.fleet.ray_serve import ray_serve_app
    from framework.results import deploy

    if args.format not in FORMATS:
        raise ConfigError("command line", "--format", args.format, f"expected one of {', '.join(FORMATS)}")
    sw, trials = _stored(args.sweep)
    if trials.empty:
        print(f"no results for sweep {sw.spec.name} in {sw.store.location}", file=sys.stderr)
        return EXIT_NOTHING
    found = deploy.shipped(trials, sw.spec, list(sw.space.parameters), sw.space.run_params,
                           target=sw.target, price_of=sw.price)
    if not isinstance(found, deploy.Shipped):
        print(found.headline, file=sys.stderr)
        return EXIT_NOTHING
    version = trials.loc[trials["trial_number"] == found.trial, "vllm_version"].iloc[0]
    if args.format == "serve":
        text = deploy.serve_text(found)
    elif args.format == "json":
        text = json.dumps(deploy.as_json(found), indent=2) + "\n"
    elif args.format == "ray-serve":
        from framework.cluster.serve_llm import check_ray_serve_config

        doc = ray_serve_app(deploy.deployment(found, image=""))
        check_ray_serve_config(doc)
        text = yaml.safe_dump(doc, sort_keys=False)
    else:
        text = _k8s_text(sw, found, version, args)
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
            raise ConfigError(path, "results_dir", sw.store.location, "no results to compare")
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
