"""The router's source as files, for running it outside this project's install (the
prefill/decode Kubernetes export ships them in a ConfigMap: fleet/k8s_pd.py).

`framework.engine.router` imports, of this project, only `framework.base.vocabulary` (through
the packages' `__init__`s, which import nothing else eagerly: base.exports' lazy exports);
beyond the standard library it needs aiohttp and prometheus_client (and uses uvloop where
installed), all three dependencies of vLLM itself, so vLLM's image runs it with these files on
PYTHONPATH (tests/unit/engine/test_router.py runs them so, from a folder of their own).
"""

from __future__ import annotations

from pathlib import Path

ROUTER_FILES = ("framework/__init__.py", "framework/base/__init__.py",
                "framework/base/exports.py", "framework/base/vocabulary.py",
                "framework/engine/__init__.py", "framework/engine/router.py")


def standalone_files() -> dict[str, str]:
    """Path (relative to the import root) -> text of every file the router imports."""
    root = Path(__file__).resolve().parents[2]
    return {path: (root / path).read_text(encoding="utf-8") for path in ROUTER_FILES}
