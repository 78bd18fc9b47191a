"""The repository's places the tests use: its root, the tiny model, the CLI's argv."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


TINY_MODEL = ROOT / "models" / "tiny-llama"


CLI = [sys.executable, "-m", "framework.cli"]
