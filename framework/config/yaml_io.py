"""Reading configuration files: YAML that rejects repeated keys, pydantic's first error as one
(key, value, reason) line, and the one value never echoed: a secret written in a sweep file."""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any
from typing import TypeVar

import yaml
from pydantic import BaseModel
from pydantic import ValidationError

from framework.base.errors import ConfigError

HIDDEN = "<hidden>"  # shown in place of a secret's value


API_KEY_WAY = ("an API key does not belong in the sweep file: it would be recorded with the "
               "servers' flags and environment (trial rows, report, Ray's tables); put it in an "
               "environment variable of the driver and name that variable in server.api_key_env")


class SecretInSweep(ValueError):
    """A credential written in a sweep file at `name` (under its section); its value is never
    shown. `reason`: the safe way (default: the API key's, server.api_key_env)."""

    def __init__(self, name: str, reason: str = API_KEY_WAY) -> None:
        self.name = name
        super().__init__(reason)


def first_error(exc: ValidationError) -> tuple[str, Any, str]:
    """The first error as (dotted key, value, reason); a SecretInSweep's key names the
    entry and its value is HIDDEN."""
    err = exc.errors()[0]
    key = ".".join(str(p) for p in err["loc"]) or "(top level)"
    msg = err["msg"].removeprefix("Value error, ")
    cause = err.get("ctx", {}).get("error")
    if isinstance(cause, SecretInSweep):
        return ".".join(str(p) for p in (*err["loc"], cause.name)), HIDDEN, msg
    if isinstance(cause, EntryError):
        return ".".join(str(p) for p in (*err["loc"], cause.key)), cause.value, msg
    return key, err.get("input"), msg


class EntryError(ValueError):
    """A validator's error about one entry below where it runs: `key`, relative to the
    validated section (`mix.1.dataset_path` under `workload`), and that entry's `value`, so
    the error line names the entry rather than the whole section."""

    def __init__(self, key: str, value: Any, reason: str) -> None:
        self.key, self.value = key, value
        super().__init__(reason)


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key repeated in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode,
                          deep: bool = False) -> dict[Hashable, Any]:
        seen: set[Hashable] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path) -> dict[str, Any]:
    """Parse a YAML mapping; syntax errors, repeated keys and non-mappings become ConfigError."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(str(path), "(file)", str(path), exc.strerror or str(exc)) from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "(yaml)"
        lines = text.splitlines()
        source = lines[mark.line].strip() if mark and mark.line < len(lines) else None
        raise ConfigError(str(path), where, source, f"YAML syntax error: "
                          f"{getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(str(path), "(top level)", type(data).__name__, "expected a mapping")
    return data


Model = TypeVar("Model", bound=BaseModel)

# The top-level keys only one kind of file has: a file with another kind's keys and none of
# its own's was given in the wrong place.
KIND_KEYS: dict[str, tuple[str, ...]] = {"sweep": ("model", "search_space"),
                                         "search-space": ("parameters",)}


def wrong_kind(data: dict[str, Any], kind: str) -> tuple[str, list[str]] | None:
    """(the kind `data` is, the keys that tell) when it is another kind of file than `kind`
    (a key of KIND_KEYS); None when it may be `kind`. Pure."""
    if any(k in data for k in KIND_KEYS[kind]):
        return None
    for other, keys in KIND_KEYS.items():
        if other != kind and (found := [k for k in keys if k in data]):
            return other, found
    return None


def load_validated(path: Path, model: type[Model], kind: str) -> Model:
    """Read a YAML file and validate it as `model`, a file of `kind` (a key of KIND_KEYS);
    every problem is a one-line ConfigError, and a file of another kind says so."""
    data = read_yaml(path)
    if found := wrong_kind(data, kind):
        other, keys = found
        has = " and ".join(f"{k}:" for k in keys)
        lacks = " or ".join(f"{k}:" for k in KIND_KEYS[kind])
        raise ConfigError(str(path), "(top level)", keys[0],
                          f"this is a {other} file (it has {has} and no {lacks}), given where a "
                          f"{kind} file belongs")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        key, value, msg = first_error(exc)
        raise ConfigError(str(path), key, value, msg) from None
