"""What the installed vLLM's parser said about a flag or value, kept on disk per vLLM version,
so that checking a sweep again does not import vLLM (building its parser costs ~10-15 s of CPU
here, on every `run`, `validate` and `doctor`).

An entry is the answer of one pure question to one vLLM version: (kind, key) -> JSON value,
where kind is `names` (every `vllm serve` option), `value` (a flag's value: its problem or
null), `args` (fixed args together), `parsed` (a value as vLLM parses it, if a number). The
version is the installed distribution's (importlib.metadata), so an upgrade starts a new
directory. Stored under $VLLM_SWEEP_CACHE_DIR/vllm-flags/<version>/ (no variable: no cache),
one file per entry written atomically (temp file + os.replace: concurrent checks are safe); an
unreadable entry is a miss.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import tempfile
from pathlib import Path
from typing import Any

CACHE_DIR_VAR = "VLLM_SWEEP_CACHE_DIR"
MISS = object()


@functools.cache
def vllm_version() -> str | None:
    """The installed vLLM distribution's version (None: not installed), read once per
    process."""
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def _folder() -> Path | None:
    root = os.environ.get(CACHE_DIR_VAR)
    version = vllm_version()
    if not root or version is None:
        return None
    return Path(root).expanduser() / "vllm-flags" / version.replace("/", "_")


def _path(folder: Path, kind: str, key: Any) -> tuple[Path, str]:
    text = json.dumps([kind, key], sort_keys=True)
    return folder / f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:32]}.json", text


def get(kind: str, key: Any) -> Any:
    """The stored answer, or MISS."""
    folder = _folder()
    if folder is None:
        return MISS
    path, text = _path(folder, kind, key)
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return MISS
    if not isinstance(entry, dict) or entry.get("key") != text or "value" not in entry:
        return MISS
    return entry["value"]


def put(kind: str, key: Any, value: Any) -> None:
    """Store an answer (JSON-able); a cache that cannot be written is no cache."""
    folder = _folder()
    if folder is None:
        return
    path, text = _path(folder, kind, key)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w") as fh:
            json.dump({"key": text, "value": value}, fh)
        os.replace(tmp, path)
    except OSError:
        return
