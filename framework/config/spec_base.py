"""What every section of a sweep file is built on: a frozen pydantic model that refuses unknown
keys, and the pattern names (sweeps, workloads, request classes) follow."""

from __future__ import annotations

import re

from pydantic import BaseModel
from pydantic import ConfigDict

# Checked with NAME.fullmatch: re.match lets `$` match before a trailing newline ("x\n").
# As a pydantic Field pattern (Rust regex) `$` is the end of the text.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
