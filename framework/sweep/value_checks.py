"""Every value a sweep hands vLLM or the load generator, checked before anything starts.

Each fixed server argument, the fixed arguments together, and each value a search-space
parameter can take (probe_values) go through the installed vLLM's own parser and the bounds its
config fields declare (engine.flag_check); run settings (kind: run) go through the workload
field they set. A refusal is one ConfigError naming the file, the key and the value.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from framework.base.errors import ConfigError
from framework.base.vocabulary import Scalar
from framework.config.bounds import declared_problem
from framework.config.search_space import RUN_SETTINGS
from framework.config.search_space import BoolParam
from framework.config.search_space import CategoricalParam
from framework.config.search_space import FloatParam
from framework.config.search_space import IntParam
from framework.config.search_space import SearchSpace
from framework.config.specs import SweepSpec
from framework.config.specs import WorkloadSpec
from framework.engine.flag_check import args_problem
from framework.engine.flag_check import installed_vllm_flags
from framework.engine.flag_check import unknown_flag
from framework.engine.flag_check import value_problem


def probe_values(param: IntParam | FloatParam | CategoricalParam | BoolParam,
                 ) -> list[tuple[str, Scalar]]:
    """(where, value) for the values that bound what `param` can take, `where` being the key
    under the parameter that gives the value ("" for a bool's two values): bool: both;
    categorical: every choice; int or float range (log or not): low and high, and for a
    stepped int range its top step, low + floor((high - low) / step) x step, which is what
    the sampler can reach. (`default` lies within these, which the search space checks.)
    vLLM's bounds are intervals, so a range whose ends pass passes whole. Pure."""
    if isinstance(param, BoolParam):
        return [("", True), ("", False)]
    if isinstance(param, CategoricalParam):
        return [("choices", c) for c in param.choices]
    found: list[tuple[str, Scalar]] = [("low", param.low), ("high", param.high)]
    if isinstance(param, IntParam):
        top = param.low + (param.high - param.low) // param.step * param.step
        if top != param.high:
            found.append(("step", top))
    return found


def _key(name: str, where: str) -> str:
    return f"parameters.{name}.{where}" if where else f"parameters.{name}"


def check_flag_values(path: Path, spec: SweepSpec, space: SearchSpace) -> None:
    """Fixed args and searched parameters must be flags of the installed vLLM, and every value
    they can take one vLLM accepts (nothing is checked when vLLM is not installed here)."""
    known = installed_vllm_flags()
    if known is None:
        return
    if bad := unknown_flag(spec.server.args, known):
        raise ConfigError(str(path), f"server.args.{bad[0]}", bad[0], bad[1])
    if bad := unknown_flag(space.server_params(space.parameters), known):
        raise ConfigError(str(spec.search_space), f"parameters.{bad[0]}", bad[0], bad[1])
    for name, value in spec.server.args.items():
        if problem := value_problem(name, value):
            raise ConfigError(str(path), f"server.args.{name}", value, problem)
    if problem := args_problem(spec.server.args):
        raise ConfigError(str(path), "server.args", dict(spec.server.args), problem)
    for name, param in space.parameters.items():
        if param.kind != "server":
            continue
        for where, value in probe_values(param):
            if problem := value_problem(name, value):
                raise ConfigError(str(spec.search_space), _key(name, where), value, problem)


def check_run_settings(spec: SweepSpec, space: SearchSpace,
                       fields: Mapping[str, str] = RUN_SETTINGS) -> None:
    """Every value a run setting (kind: run) can take must be one its workload field accepts
    (max-concurrency sets workload.max_concurrency: an int > 0; a float range cannot set an
    int): trials apply them without validating again (trial_load.with_run_settings). A timed
    trace times its requests: request-rate and burstiness do not apply to it, speed-up only
    to it; with `workloads:`, the setting reaches every one of them, so each must take it."""
    named = ([(f"workloads.{w.name}.dataset", w.dataset) for w in spec.workloads]
             or [("workload.dataset", spec.workload.dataset)])
    for name in space.run_params:
        paced = name in ("speed-up", "request-rate", "burstiness")
        if wrong := [f"{key} is {dataset}" for key, dataset in named
                     if paced and (dataset == "timed_trace") != (name == "speed-up")]:
            raise ConfigError(str(spec.search_space), f"parameters.{name}", "kind: run",
                              "speed-up applies to dataset timed_trace only, request-rate and "
                              f"burstiness to the other datasets ({', '.join(wrong)})")
        field, param = fields[name], space.parameters[name]
        for where, value in probe_values(param):
            # a float range sends fractions between its ends: an int setting refuses them
            strict = isinstance(param, FloatParam)
            if problem := declared_problem(WorkloadSpec.model_fields[field], value, strict):
                raise ConfigError(str(spec.search_space), _key(name, where), value,
                                  f"{problem} (it sets workload.{field})")
