"""A value against the type and bounds a pydantic field declares (`Field(gt=0)`, `PositiveInt`,
`Literal[...]`): what a config class would say of it, without building the class."""

from __future__ import annotations

from typing import Annotated
from typing import Any

from pydantic import TypeAdapter
from pydantic import ValidationError
from pydantic.fields import FieldInfo


def declared_problem(info: FieldInfo, value: Any, strict: bool = False) -> str | None:
    """Pydantic's first message for `value` against the field's annotation and constraints
    (its `metadata`: Gt, Ge, Lt, Le, ...), e.g. 'input should be greater than or equal to -1';
    None when the field accepts it. `strict`: no conversion (a float is no int, even 2.0).
    `None` itself is left to the caller (vLLM's optional flags parse "None" to None and skip
    validation)."""
    if value is None:
        return None
    hint: Any = Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation
    try:
        TypeAdapter(hint).validate_python(value, strict=strict)
    except ValidationError as exc:
        msg = exc.errors()[0]["msg"]
        return msg[:1].lower() + msg[1:]
    return None
