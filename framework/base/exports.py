"""A room's public names, re-exported lazily from its package: `from framework.trial import
run_trial` works, and importing a room imports none of its modules until a name is used (so
`vllm-sweep bench` still imports no vLLM, and no re-export can close an import circle)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from collections.abc import Mapping


def lazy_exports(package: str, names: Mapping[str, str]) -> tuple[Callable[[str], object], list[str]]:
    """(`__getattr__`, `__all__`) for `package`: `names` maps a public name to the module of
    the package that defines it (PEP 562)."""

    def __getattr__(name: str) -> object:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{names[name]}"), name)

    return __getattr__, sorted(names)
