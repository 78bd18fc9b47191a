"""A sweep's parts checked against each other before anything starts: the workload, the fixed
server args, the search space and the results location. What would make every request or every
trial fail is a ConfigError here, not a sweep of failed trials:

- a flag both fixed (server.args) and searched;
- the workload's requests longer than max-model-len allows in every trial;
- chunked prefill off with max-num-batched-tokens < max-model-len, or max-num-batched-tokens <
  max-num-seqs, in every trial (vLLM refuses to start);
- an objective or SLA metric the workload cannot produce (these two rules for every workload
  of `workloads:` and every class of a mix);
- a results location that is not a writable directory; a workload.tokenizer folder without
  tokenizer.json;
- cluster.start_ahead on the GPU engine (its trials already run side by side on free GPUs);
- a distributed-executor-backend or data-parallel-size no trial can run with
  (cluster.placement.shape_problem: on GPUs mp at TP x PP > 1, ray at TP x PP = 1,
  data-parallel-size > 1; on the CPU engine data-parallel-size > 1 with TP x PP > 1).

"Every trial" ranges over the values each flag takes (flag_values: fixed, each probe value of
a searched flag, vLLM's default where a conditional flag is left out). The rules are monotone
in each number, so the bounds of a range decide, and taking the flags as independent can only
add passing combinations: a rule reported broken is broken in every trial the sweep can run.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

from framework.base.errors import ConfigError
from framework.base.vocabulary import Scalar
from framework.base.vocabulary import parse_latency_key
from framework.cluster.placement import Shape
from framework.cluster.placement import shape_problem
from framework.config.search_space import SearchSpace
from framework.config.specs import SweepSpec
from framework.config.specs import WorkloadSpec
from framework.engine.flag_check import parsed_number
from framework.engine.model_info import read_model_info
from framework.load.prompts import load_tokenizer
from framework.load.prompts import num_special_tokens_to_add
from framework.load.prompts import uniform_length_bounds
from framework.sweep.value_checks import probe_values
from framework.trial.objective import goodput_slo_ms

Number = int | float
SCHEDULER = "vllm/config/scheduler.py, SchedulerConfig.verify_max_model_len"


@dataclass(frozen=True)
class RequestLengths:
    """Token counts of the workload's requests, each as (shortest, longest)."""

    prompt: tuple[int, int]
    output: tuple[int, int]

    @property
    def longest(self) -> int:
        return self.prompt[1] + self.output[1]


def request_lengths(w: WorkloadSpec, num_special: int) -> RequestLengths | None:
    """random: prompts of s + [floor(n(1-r)), ceil(n(1+r))] tokens, n = input_len - s, s the
    special tokens the tokenizer adds; outputs [max(1, floor(o(1-r))), ceil(o(1+r))]
    (load.workload.random_requests). prefix-shared: input_len and output_len exactly. sharegpt:
    None (the lengths come from the file). The chat endpoint adds its template's tokens to
    every prompt: these are lower bounds there. Pure."""
    if w.dataset == "prefix-shared":
        return RequestLengths((w.input_len, w.input_len), (w.output_len, w.output_len))
    if w.dataset != "random":
        return None
    low, high = uniform_length_bounds(w.input_len - num_special, w.range_ratio, minimum=0)
    return RequestLengths((low + num_special, high + num_special),
                          uniform_length_bounds(w.output_len, w.range_ratio, minimum=1))


def _span(low: int, high: int) -> str:
    return str(low) if low == high else f"{low}-{high}"


def length_problem(lengths: RequestLengths, max_lens: Sequence[Number]) -> str | None:
    """Why the workload does not fit max-model-len in any trial (None: it fits in one at least).
    vLLM refuses a request whose prompt has max-model-len tokens or more
    (vllm/renderers/params.py, _token_len_check; a prompt of exactly max-model-len leaves
    max_tokens 0, which vllm/sampling_params.py refuses) or whose output is longer than
    max-model-len (renderers/params.py, __post_init__),
    and cuts the output of one whose prompt + output exceed it
    (vllm/entrypoints/serve/utils/api_utils.py, get_max_tokens). Pure."""
    m = max(max_lens)
    if lengths.longest <= m:
        return None
    (p0, p1), (o0, o1) = lengths.prompt, lengths.output
    if p0 >= m or o0 > m:
        return (f"every request is refused: prompts of {_span(p0, p1)} tokens and outputs of "
                f"{_span(o0, o1)} do not fit max-model-len {m} (vLLM refuses a prompt of "
                "max-model-len tokens or more, and an output longer than max-model-len)")
    return (f"requests of up to {p1} prompt + {o1} output = {lengths.longest} tokens exceed "
            f"max-model-len {m} in every trial: vLLM cuts their output to fit (or refuses "
            "them), so no trial would serve this workload (vllm/entrypoints/serve/utils/"
            "api_utils.py, get_max_tokens)")


def _known(values: Sequence[Number | None]) -> TypeGuard[Sequence[Number]]:
    """No None (vLLM's default) among `values`."""
    return None not in values


def chunk_problem(chunked: Sequence[bool | None], tokens: Sequence[Number | None],
                  max_lens: Sequence[Number | None]) -> str | None:
    """Chunked prefill off and max-num-batched-tokens < max-model-len in every trial: vLLM
    refuses to start (SCHEDULER). None stands for vLLM's default: chunked prefill on, and
    max-num-batched-tokens raised to max-model-len when it is off
    (vllm/engine/arg_utils.py, EngineArgs._set_default_max_num_seqs_and_batched_tokens_args).
    Pure."""
    if any(c is not False for c in chunked) or not _known(tokens) or not _known(max_lens):
        return None
    if max(tokens) >= min(max_lens):
        return None
    return (f"chunked prefill is off and max-num-batched-tokens (at most {max(tokens)}) < "
            f"max-model-len (at least {min(max_lens)}) in every trial: vLLM refuses to start "
            f"({SCHEDULER})")


def seqs_problem(tokens: Sequence[Number | None], seqs: Sequence[Number | None]) -> str | None:
    """max-num-batched-tokens < max-num-seqs in every trial: vLLM refuses to start
    (SCHEDULER). None (vLLM's defaults) is left out: vLLM lowers a default max-num-seqs to
    max-num-batched-tokens. Pure."""
    if not _known(tokens) or not _known(seqs) or max(tokens) >= min(seqs):
        return None
    return (f"max-num-batched-tokens (at most {max(tokens)}) < max-num-seqs (at least "
            f"{min(seqs)}) in every trial: vLLM refuses to start ({SCHEDULER})")


def metric_problem(spec: SweepSpec, lengths: RequestLengths | None) -> tuple[str, str, str] | None:
    """(key, metric, why) for an objective or SLA metric no run of this workload reports:
    goodput without a per-request limit (ttft, tpot, e2el) in the SLA (load.metrics reports
    none, like vLLM bench), or TPOT / ITL when every request has one output token. Pure."""
    keys = [("objective.metric", spec.objective.metric),
            *(("objective.pareto_with", m) for m in spec.objective.pareto_with),
            *((f"sla.{k}", k) for k in spec.sla)]
    for key, metric in keys:
        if metric.startswith("request_goodput") and not goodput_slo_ms(spec.sla):
            return (key, metric, "goodput counts the requests within the SLA's per-request limits "
                    "(a ttft, tpot or e2el key in sla:); this sla sets none, so no run reports it "
                    "and every trial would fail")
        parsed = parse_latency_key(metric)
        if parsed and parsed.metric in ("tpot", "itl") and lengths and lengths.output[1] <= 1:
            return (key, metric, "every request has 1 output token, so there is no time between "
                    "output tokens: TPOT and ITL would be 0 in every trial")
    return None


def results_problem(results_dir: Path, name: str) -> tuple[Path, str] | None:
    """(path, why) when the sweep's results cannot be written: the nearest existing path of
    results_dir/name must be a directory this process may write into."""
    for path in (results_dir / name, *(results_dir / name).parents):
        if path.exists():
            if not path.is_dir():
                return path, "exists and is not a directory"
            if not os.access(path, os.W_OK | os.X_OK):
                return path, "is not writable"
            return None
    return None


def flag_values(name: str, spec: SweepSpec, space: SearchSpace) -> list[Scalar | None]:
    """The values flag `name` takes across trials: the fixed one (a `no-` form negated), else
    each probe value of the searched one plus None (vLLM's default) where a `when` condition
    leaves it out, else [None]."""
    args = spec.server.args
    if name in args:
        return [args[name]]
    if isinstance(args.get(f"no-{name}"), bool):
        return [not args[f"no-{name}"]]
    param = space.parameters.get(name)
    if param is None:
        return [None]
    values: list[Scalar | None] = list(dict.fromkeys(v for _, v in probe_values(param)))
    return [*values, None] if param.when else values


def _numbers(name: str, values: Sequence[Scalar | None]) -> list[Number | None] | None:
    """The values as vLLM parses them (max-model-len '1k' -> 1000); None when one is no
    number (or vLLM is not here to parse it)."""
    out: list[Number | None] = []
    for value in values:
        if value is None:
            out.append(None)
            continue
        number, parsed = parsed_number(name, value)
        if not number:
            return None
        out.append(parsed)
    return out


def _where(name: str, path: Path, spec: SweepSpec) -> tuple[str, str]:
    if name in spec.server.args:
        return str(path), f"server.args.{name}"
    return str(spec.search_space), f"parameters.{name}"


def special_tokens(spec: SweepSpec) -> int:
    """Tokens the workload's tokenizer adds to each prompt (0 without a tokenizer.json)."""
    folder = spec.workload.tokenizer or spec.model
    if not (folder / "tokenizer.json").is_file():
        return 0
    return num_special_tokens_to_add(load_tokenizer(folder))


def check_workload_fits(path: Path, spec: SweepSpec, space: SearchSpace,
                        lengths: RequestLengths | None) -> None:
    """The vLLM rules across flags and workload (every trial breaking one is a ConfigError):
    request lengths vs max-model-len (unset: the model's max_position_embeddings, vLLM's
    default; -1/auto: unknown, taken as fitting), chunked prefill and the batch limits."""
    model_max = read_model_info(spec.model, str(path)).max_position_embeddings
    lens = _numbers("max-model-len", flag_values("max-model-len", spec, space))
    if lens is not None:
        lens = [model_max if v is None else math.inf if v == -1 else v for v in lens]
    if lengths and lens and _known(lens) and (problem := length_problem(lengths, lens)):
        if "max-model-len" in spec.server.args:
            raise ConfigError(str(path), "server.args.max-model-len",
                              spec.server.args["max-model-len"], problem)
        if "max-model-len" in space.parameters:
            raise ConfigError(str(spec.search_space), "parameters.max-model-len", max(lens),
                              problem)
        raise ConfigError(str(path), "workload.input_len", spec.workload.input_len,
                          f"{problem}; max-model-len is unset, so vLLM takes the model's "
                          f"max_position_embeddings {model_max}")
    tokens = _numbers("max-num-batched-tokens", flag_values("max-num-batched-tokens", spec, space))
    if tokens is None:
        return
    where = _where("max-num-batched-tokens", path, spec)
    chunked = [c if isinstance(c, bool) else None
               for c in flag_values("enable-chunked-prefill", spec, space)]
    if lens is not None and (problem := chunk_problem(chunked, tokens, lens)) and _known(tokens):
        raise ConfigError(*where, max(tokens), problem)
    seqs = _numbers("max-num-seqs", flag_values("max-num-seqs", spec, space))
    if seqs is not None and (problem := seqs_problem(tokens, seqs)) and _known(tokens):
        raise ConfigError(*where, max(tokens), problem)


PARALLEL_FLAGS = ("distributed-executor-backend", "data-parallel-size", "tensor-parallel-size",
                  "pipeline-parallel-size")


def parallel_problem(values: Mapping[str, Sequence[Scalar | None]], engine: str = "gpu"
                     ) -> tuple[str, Scalar, str] | None:
    """(flag, value, why) for a value of one of PARALLEL_FLAGS that fails `shape_problem`
    together with every value the other three take (None: vLLM's default; a searched value
    that works with some other values passes here and is refused per trial, as infeasible, by
    trial_plan.rejection). Flags are tried in PARALLEL_FLAGS' order, each value in turn. Pure."""
    def problem(combo: Sequence[Scalar | None]) -> str | None:
        backend, dp, tp, pp = combo
        return shape_problem(engine, None if backend is None else str(backend),
                             Shape(tp=int(tp or 1), pp=int(pp or 1), dp=int(dp or 1)))

    columns = [list(values.get(name) or [None]) for name in PARALLEL_FLAGS]
    combos = list(itertools.product(*columns))
    for i, name in enumerate(PARALLEL_FLAGS):
        for value in columns[i]:
            found = [problem(c) for c in combos if c[i] == value]
            if value is not None and all(found):
                return name, value, str(found[0])
    return None


def check_parallel(path: Path, spec: SweepSpec, space: SearchSpace) -> None:
    """A distributed-executor-backend or data-parallel-size (fixed or searched) that no trial
    can run with (parallel_problem) is a ConfigError."""
    values = {name: flag_values(name, spec, space) for name in PARALLEL_FLAGS}
    if found := parallel_problem(values, spec.engine):
        name, value, why = found
        raise ConfigError(*_where(name, path, spec), value, why)


def check_cross(path: Path, spec: SweepSpec, space: SearchSpace, vllm_rules: bool) -> None:
    """Every cross check of the module docstring; `vllm_rules`: also the vLLM flag rules
    (check_workload_fits; not for the fake engine, which is no vLLM)."""
    fixed = {n.replace("_", "-") for n in spec.server.args}
    for name in space.parameters:
        if name.replace("_", "-") in fixed:
            raise ConfigError(str(spec.search_space), f"parameters.{name}", name,
                              f"also fixed in server.args of {path}: fix it or search it, not "
                              "both (searched trials would replace the fixed value, and the "
                              "baseline trial run it while recording the parameter's default)")
    if spec.cluster.start_ahead and spec.engine == "gpu":
        raise ConfigError(str(path), "cluster.start_ahead", spec.cluster.start_ahead,
                          "GPU trials already start side by side on free GPUs "
                          "(cluster.max_concurrent_trials); start_ahead is for the CPU engine, "
                          "whose trials share cores")
    check_parallel(path, spec, space)
    w = spec.workload
    if w.tokenizer is not None and not (w.tokenizer / "tokenizer.json").is_file():
        raise ConfigError(str(path), "workload.tokenizer", str(w.tokenizer),
                          "no tokenizer.json there (the load generator tokenizes prompts with it)")
    if isinstance(spec.results_dir, Path) and (found := results_problem(spec.results_dir,
                                                                        spec.name)):
        raise ConfigError(str(path), "results_dir", str(spec.results_dir),
                          f"{found[0]} {found[1]}: the sweep's results cannot be written")
    special = special_tokens(spec)
    for view in workload_views(spec):
        lengths = request_lengths(view, special)
        one = spec.model_copy(update={"workload": view})
        if vllm_rules:
            check_workload_fits(path, one, space, lengths)
        if bad := metric_problem(one, lengths):
            raise ConfigError(str(path), *bad)


def workload_views(spec: SweepSpec) -> list[WorkloadSpec]:
    """Every workload the sweep sends, as the checks see it: each of `workloads:` (else the
    workload), a mix as each of its classes."""
    views = []
    for w in spec.workloads or (spec.workload,):
        views += [w.for_class(c.name) for c in w.mix] if w.mix else [w]
    return views
