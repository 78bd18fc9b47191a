"""Flag names and values against the installed vLLM's own `vllm serve` parser.

A value is checked as the server will receive it (engine.server_args.flag_args: `--name value`,
a bool as `--name` / `--no-name`): argparse's type and choices, then the bounds vLLM declares on
the config field behind the flag (vllm/config/*.py: `Field(ge=1)`, `Field(gt=0, le=1)`, ...;
the config classes are pydantic dataclasses, so the field's annotation and constraints give
vLLM's own check), then the few bounds vLLM checks only once its config is built
(AFTER_BUILD). The parser is built once per process; building it imports vLLM (seconds), so
it is imported here lazily and nowhere else on the validation path, and its answers are kept
per vLLM version (engine.flag_cache): a sweep checked before is checked without vLLM.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import os
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic.fields import FieldInfo

from framework.base.vocabulary import Scalar
from framework.config.bounds import declared_problem
from framework.engine import flag_cache
from framework.engine.server_args import flag_args

V0_ONLY = {
    "num-scheduler-steps": "belongs to vLLM's old V0 engine (multi-step scheduling); the V1 engine "
                           "of vLLM >= 0.11 removed it",
    "use-v2-block-manager": "belongs to vLLM's old V0 engine; the V1 engine removed it",
}

# Bounds vLLM checks on the built config, not on the field (dest -> (accepts, why not)).
AFTER_BUILD: dict[str, tuple[Callable[[Any], bool], str]] = {
    "max_model_len": (lambda v: v == -1 or v >= 1,
                      "max_model_len must be -1 (auto) or >= 1 (vLLM's "
                      "ModelConfig.validate_model_config_after, vllm/config/model.py)"),
}

# A stand-in for the model in parsed argv: a value that is not a flag's must not be taken for
# `vllm serve`'s optional positional model tag.
_MODEL = "model"


class FlagRejected(ValueError):
    """vLLM's parser (or its serve-args check) refused the argv; the message is its own."""


@dataclass(frozen=True)
class VllmFlags:
    """The installed vLLM's `vllm serve` parser (raising FlagRejected instead of exiting), the
    config field declaring each constrained option's bounds (dest -> (class name, field)),
    vLLM's serve-args check (vllm/entrypoints/launchers/cli_args.py,
    validate_parsed_serve_args) and the exceptions it raises to refuse arguments (ValueError,
    TypeError, vllm/exceptions.py's VLLMError)."""

    parser: argparse.ArgumentParser
    fields: Mapping[str, tuple[str, FieldInfo]]
    check_serve_args: Callable[[argparse.Namespace], None]
    rejections: tuple[type[Exception], ...]

    @property
    def names(self) -> set[str]:
        """Every option without leading dashes (incl. `no-x` forms)."""
        return {opt.lstrip("-") for action in self.parser._actions
                for opt in action.option_strings}

    def parse(self, argv: list[str]) -> argparse.Namespace:
        """`vllm serve model <argv>` parsed; FlagRejected with argparse's message."""
        return self.parser.parse_args([_MODEL, *argv])

    def dest(self, name: str) -> str | None:
        action = self.parser._option_string_actions.get("--" + name.replace("_", "-"))
        return action.dest if action is not None else None


def _constrained_fields(parser: argparse.ArgumentParser) -> dict[str, tuple[str, FieldInfo]]:
    """dest -> (config class, field) for options whose vLLM config field declares constraints.
    A parser group is titled after the config class it was built from (EngineArgs.add_cli_args:
    `add_argument_group(title="ModelConfig")`); an option that class lacks (a few groups mix
    classes) takes the one config class that has a field of its name."""
    import vllm.config

    classes = {name: cls for name in dir(vllm.config)
               if isinstance(cls := getattr(vllm.config, name), type)
               and hasattr(cls, "__pydantic_fields__")}
    owners: dict[str, list[tuple[str, FieldInfo]]] = {}
    for name, cls in classes.items():
        for field, info in cls.__pydantic_fields__.items():
            owners.setdefault(field, []).append((name, info))
    found: dict[str, tuple[str, FieldInfo]] = {}
    for group in parser._action_groups:
        for action in group._group_actions:
            mine = [o for o in owners.get(action.dest, ()) if o[0] == group.title]
            candidates = mine or owners.get(action.dest, [])
            if len(candidates) == 1 and candidates[0][1].metadata:
                found[action.dest] = candidates[0]
    return found


@functools.lru_cache(maxsize=1)
def installed_vllm() -> VllmFlags | None:
    """The installed vLLM's flags (built once per process); None if vLLM is not installed."""
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            from vllm.entrypoints.launchers.cli_args import make_arg_parser
            from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args
            from vllm.exceptions import VLLMError
            from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        return None

    class RaisingParser(FlexibleArgumentParser):
        def error(self, message: str):  # argparse would print usage and exit 2
            raise FlagRejected(message)

    parser = make_arg_parser(RaisingParser(prog="vllm serve"))
    return VllmFlags(parser=parser, fields=_constrained_fields(parser),
                     check_serve_args=validate_parsed_serve_args,
                     rejections=(ValueError, TypeError, VLLMError))


def installed_vllm_flags() -> set[str] | None:
    """Every option of `vllm serve` without leading dashes (incl. `no-x` forms); None if vLLM is
    not installed here. Answered from engine.flag_cache when it can be."""
    if (cached := flag_cache.get("names", None)) is not flag_cache.MISS:
        return set(cached)
    vllm = installed_vllm()
    if vllm is None:
        return None
    flag_cache.put("names", None, sorted(vllm.names))
    return vllm.names


def unknown_flag(names: Iterable[str], known: set[str]) -> tuple[str, str] | None:
    """The first name vLLM does not know, with the reason; None if all are known."""
    for name in names:
        if name.replace("_", "-") not in known:
            reason = V0_ONLY.get(name) or "not a flag of the installed vLLM (`vllm serve --help`)"
            return name, reason
    return None


def parsed_value(vllm: VllmFlags, name: str, value: Scalar) -> Any:
    """What vLLM's parser makes of `--name value` (bools as `--name` / `--no-name`), e.g.
    max-model-len '1k' -> 1000; FlagRejected with the parser's message."""
    namespace = vllm.parse(flag_args({name: value}))
    dest = vllm.dest(name)
    return getattr(namespace, dest) if dest else None


def _names_a_file(value: Scalar) -> bool:
    """A value vLLM may read from disk (a chat template, a tokenizer, a JSON file): its
    answer depends on the file, not only on vLLM, so it is never cached."""
    return isinstance(value, str) and ("/" in value or "\\" in value or os.path.exists(value))


def _cached(kind: str, key: Any, values: Iterable[Scalar],
            answer: Callable[[VllmFlags], Any]) -> Any:
    """`answer(vllm)` through engine.flag_cache (not for `values` naming files); None without
    vLLM (never cached)."""
    pure = not any(_names_a_file(v) for v in values)
    if pure and (cached := flag_cache.get(kind, key)) is not flag_cache.MISS:
        return cached
    vllm = installed_vllm()
    if vllm is None:
        return None
    value = answer(vllm)
    if pure:
        flag_cache.put(kind, key, value)
    return value


def value_problem(name: str, value: Scalar) -> str | None:
    """Why the installed vLLM refuses `value` for flag `name` (None: accepted, or no vLLM
    here): the parser's type or choices, the bound its config field declares, or a bound it
    checks on the built config."""
    return _cached("value", [name, value], [value], lambda vllm: _value_problem(vllm, name, value))


def parsed_number(name: str, value: Scalar) -> tuple[bool, int | float | None]:
    """(is a number, the number) for `value` as vLLM parses it (max-model-len '1k' -> 1000);
    (True, value) as given when vLLM is not here and `value` is a number."""
    def answer(vllm: VllmFlags) -> list[Any]:
        try:
            parsed = parsed_value(vllm, name, value)
        except vllm.rejections:
            return [False, None]
        number = parsed is not None and not isinstance(parsed, bool) \
            and isinstance(parsed, int | float)
        return [number, parsed if number else None]

    found = _cached("parsed", [name, value], [value], answer)
    if found is None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False, None
        return True, value
    return bool(found[0]), found[1]


def _value_problem(vllm: VllmFlags, name: str, value: Scalar) -> str | None:
    action = vllm.parser._option_string_actions.get("--" + name.replace("_", "-"))
    if action is not None and action.nargs == 0 and not isinstance(value, bool):
        off = f" or false (--no-{name})" \
            if isinstance(action, argparse.BooleanOptionalAction) else ""
        return f"--{name} is a switch: write true (--{name}){off}, not a value"
    try:
        parsed = parsed_value(vllm, name, value)
    except vllm.rejections as exc:  # FlagRejected, or a check inside vLLM's parse_args
        return f"vLLM's parser: {exc}"
    dest = vllm.dest(name)
    if dest is None or parsed is None:
        return None
    if dest in vllm.fields:
        owner, info = vllm.fields[dest]
        if problem := declared_problem(info, parsed):
            return f"{problem} (vLLM's {owner}.{dest})"
    if dest in AFTER_BUILD:
        accepts, rule = AFTER_BUILD[dest]
        if not accepts(parsed):
            return rule
    return None


def args_problem(args: Mapping[str, Scalar]) -> str | None:
    """Why vLLM refuses these flags together (None: accepted, or no vLLM here): parsed as one
    command line, then vLLM's serve-args check (e.g. --enable-auto-tool-choice needs
    --tool-call-parser; a chat template that cannot be read)."""
    def answer(vllm: VllmFlags) -> str | None:
        try:
            vllm.check_serve_args(vllm.parse(flag_args(args)))
        except vllm.rejections as exc:
            return f"vLLM: {exc}"
        return None

    return _cached("args", sorted([k, v] for k, v in args.items()), args.values(), answer)
