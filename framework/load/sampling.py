"""Sampling settings of the load's requests, as `vllm bench serve` sends them.

vllm bench serve (vLLM 0.32, ``vllm/benchmarks/serve.py``, argument group "sampling
parameters" and main_async's "Collect the sampling parameters") has seven sampling flags, all
``default=None``; only the flags given go into every request's JSON body (through
``extra_body``, merged last by ``_update_payload_common`` in
``vllm/benchmarks/lib/endpoint_request_func.py``). A flag left unset is not sent, and the
server's default applies. ``Sampling`` holds the same seven optional fields, in that order;
``request_fields`` is the part of a request body they make.

What unset means on the server: vLLM's OpenAI handlers take each field as "request value ->
server default -> OpenAI default" (``to_sampling_params`` in
``vllm/entrypoints/openai/completion/protocol.py`` and ``.../chat_completion/protocol.py``,
``_DEFAULT_SAMPLING_PARAMS``: temperature 1.0, top_p 1.0, top_k 0 (off), min_p 0.0, the three
penalties neutral). The server default comes from the model's generation_config.json under
``--generation-config auto`` (``ModelConfig.get_diff_sampling_param`` in
``vllm/config/model.py``), plus ``--override-generation-config``. So an unset temperature is
random sampling at 1.0 for a model whose generation_config names none (the project's tiny
Llama), while ``temperature 0`` is greedy: ``SamplingParams.__post_init__``
(``vllm/sampling_params.py``) then resets top_p, top_k and min_p to neutral, and the request
samples by argmax. One difference kept on purpose: vllm bench's completions requests always
carry ``"repetition_penalty": 1.0`` (``async_request_openai_completions``); ours carry it only
when set, as the issue's contract says. The two differ only for a model whose
generation_config sets a repetition penalty.

Stdlib only: `vllm-sweep bench` builds its parser from ``add_cli_args`` without importing
anything heavy. The sweep's ``workload.sampling`` (framework.config.sampling_spec) validates
the same fields with the ranges vLLM accepts.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import asdict
from dataclasses import dataclass

# vllm bench serve's sampling flags, in its order: (field, type). Flag = --field with dashes.
SAMPLING_FLAGS: tuple[tuple[str, type], ...] = (
    ("top_p", float), ("top_k", int), ("min_p", float), ("temperature", float),
    ("frequency_penalty", float), ("presence_penalty", float), ("repetition_penalty", float),
)


@dataclass(frozen=True)
class Sampling:
    """The sampling fields a load sends; None = not sent (the server's default applies)."""

    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    temperature: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None


GREEDY = Sampling(temperature=0.0)


def request_fields(sampling: Sampling) -> dict[str, float | int]:
    """The set fields as JSON body entries (name -> value), in SAMPLING_FLAGS order; {} if
    none is set. Pure."""
    return {name: value for name, value in asdict(sampling).items() if value is not None}


def sampling_json(sampling: Sampling) -> str:
    """``request_fields`` as compact JSON with sorted keys ("{}" when none is set): the trial
    row's ``sampling`` column and bench's ``sampling`` key."""
    return json.dumps(request_fields(sampling), sort_keys=True, separators=(",", ":"))


def sampling_from(values: Mapping[str, object]) -> Sampling:
    """A Sampling from a mapping of field -> value (None = unset); unknown names raise
    KeyError. Values are not checked here (the config spec and bench's flags check them)."""
    unknown = sorted(set(values) - {name for name, _ in SAMPLING_FLAGS})
    if unknown:
        raise KeyError(f"unknown sampling field(s) {unknown}")
    return Sampling(**values)  # type: ignore[arg-type]


def add_cli_args(p: argparse.ArgumentParser) -> None:
    """vllm bench serve's sampling flags: same names, types and default (None: not sent)."""
    group = p.add_argument_group("sampling parameters",
                                 "sent only when given, as vllm bench does; unset = the "
                                 "server's default (vLLM: generation_config, else temperature 1)")
    for name, kind in SAMPLING_FLAGS:
        group.add_argument("--" + name.replace("_", "-"), type=kind, default=None,
                           help=f"{name.replace('_', '-')} sampling parameter")


def from_args(args: argparse.Namespace, where: str) -> Sampling:
    """The sampling flags of parsed ``args`` (those add_cli_args added), checked against the
    ranges vLLM accepts (config.sampling_spec): ConfigError(where, --flag, value) if not."""
    from pydantic import ValidationError

    from framework.base.errors import ConfigError
    from framework.config.sampling_spec import SamplingSpec

    values = {name: getattr(args, name) for name, _ in SAMPLING_FLAGS}
    try:
        SamplingSpec(**values)
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0])
        raise ConfigError(where, "--" + name.replace("_", "-"), values[name],
                          error["msg"]) from None
    return sampling_from(values)
