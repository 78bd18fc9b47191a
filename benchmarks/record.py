"""What the benchmarks share: the machine's load line, and appending one dated section to
docs/BENCHMARKS.md (append-only: each section names its command, its date and the load)."""

from __future__ import annotations

import subprocess
from datetime import UTC
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "BENCHMARKS.md"
HEADER = ("# Benchmarks\n\nAppend-only: each section records the command that produced it, its "
          "date and the machine's load.\n")


def uptime() -> str:
    """`uptime`'s line: the load averages a reading should be judged against."""
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def append_section(title: str, preamble: str, text: str, started: datetime | None = None,
                   doc: Path = DOC) -> None:
    """Appends `## {title}, {started:%Y-%m-%d %H:%M} UTC`, the preamble paragraph and the text
    (tables, readings) to `doc`, creating it with its header if missing; says where."""
    when = started or datetime.now(UTC)
    if not doc.exists():
        doc.write_text(HEADER)
    with doc.open("a") as fh:
        fh.write(f"\n## {title}, {when:%Y-%m-%d %H:%M} UTC\n\n{preamble}\n\n{text.rstrip()}\n")
    print(f"appended to {doc}")
