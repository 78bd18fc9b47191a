"""Parameters -> vLLM server argv. Pure; never a shell string.

Flag rules (names are vLLM flags without dashes):
- True  -> `--name`;  False -> `--no-name` (vLLM's BooleanOptionalAction form);
- None  -> flag omitted;
- anything else -> `--name <str(value)>`.
Trial parameters override fixed server args of the same name.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from collections.abc import Sequence

from framework.base.vocabulary import Scalar


def flag_args(params: Mapping[str, Scalar | None]) -> list[str]:
    """Flags in the order given, one entry per argv element."""
    argv: list[str] = []
    for name, value in params.items():
        if value is None:
            continue
        if isinstance(value, bool):
            argv.append(f"--{name}" if value else f"--no-{name}")
        else:
            argv.extend([f"--{name}", str(value)])
    return argv


def merge_flags(fixed: Mapping[str, Scalar], params: Mapping[str, Scalar | None]) -> dict[str, Scalar | None]:
    """Fixed args first (in file order), then trial params; a param replaces a fixed arg."""
    merged: dict[str, Scalar | None] = {k: v for k, v in fixed.items() if k not in params}
    merged.update(params)
    return merged


def trial_flags(fixed: Mapping[str, Scalar], params: Mapping[str, Scalar | None],
                is_baseline: bool) -> dict[str, Scalar | None]:
    """Every flag of one trial: fixed args + its params (none for the vLLM-defaults baseline),
    plus vLLM's Ray executor when the trial spans several bundles (TP x PP > 1)."""
    flags = merge_flags(fixed, {} if is_baseline else params)
    tp = int(flags.get("tensor-parallel-size") or 1)
    pp = int(flags.get("pipeline-parallel-size") or 1)
    if tp * pp > 1 and "distributed-executor-backend" not in flags:
        flags["distributed-executor-backend"] = "ray"
    return flags


def server_argv(model: str, flags: Mapping[str, Scalar | None], host: str, port: int) -> list[str]:
    """argv for vLLM's OpenAI server parser (what runs in-process in the server actor)."""
    return ["--model", model, *flag_args(flags), "--host", host, "--port", str(port)]


def model_of(argv: Sequence[str]) -> str | None:
    """The `--model` value of a server_argv (None if absent)."""
    for i, arg in enumerate(argv[:-1]):
        if arg == "--model":
            return argv[i + 1]
    return None


def serve_command(model: str, flags: Mapping[str, Scalar | None]) -> str:
    """The equivalent `vllm serve ...` command line a user can paste, without host/port."""
    return shlex.join(["vllm", "serve", model, *flag_args(flags)])
