"""Check flag names against the installed vLLM's own argument parser (imports vLLM: ~4 s)."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterable

V0_ONLY = {
    "num-scheduler-steps": "belongs to vLLM's old V0 engine (multi-step scheduling); the V1 engine "
                           "of vLLM >= 0.11 removed it",
    "use-v2-block-manager": "belongs to vLLM's old V0 engine; the V1 engine removed it",
}


def installed_vllm_flags() -> set[str] | None:
    """Every option of `vllm serve` without leading dashes (incl. `no-x` forms); None if vLLM is
    not installed here."""
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            from vllm.entrypoints.launchers.cli_args import make_arg_parser
            from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        return None
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    return {opt.lstrip("-") for action in parser._actions for opt in action.option_strings}


def unknown_flag(names: Iterable[str], known: set[str]) -> tuple[str, str] | None:
    """The first name vLLM does not know, with the reason; None if all are known."""
    for name in names:
        if name.replace("_", "-") not in known:
            reason = V0_ONLY.get(name) or "not a flag of the installed vLLM (`vllm serve --help`)"
            return name, reason
    return None
