"""Names and keys checked by a pattern take the whole value (#33 item 11): with re.match, `$`
also matches before a trailing newline, so `name: "x\\n"` passed the sweep-name check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from framework.base.errors import ConfigError
from framework.base.vocabulary import parse_latency_key
from framework.base.vocabulary import split_class_key
from framework.config.specs import load_sweep

BASE = "model: models/m\nsearch_space: spaces/s.yaml\n"
MIX = ("workload: {mix: [{name: %s, weight: 1, input_len: 8, output_len: 4}, "
       "{name: other, weight: 1, input_len: 8, output_len: 4}]}\n")


def sweep(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "key", "mentions"), [
    (f"name: {json.dumps('x' + chr(10))}\n" + BASE, "name", "letters, digits"),
    (f"name: {json.dumps('x' + chr(10) + chr(10))}\n" + BASE, "name", "letters, digits"),
    ("name: t\n" + BASE + f"sla: {{{json.dumps('p99_ttft_ms' + chr(10))}: 5}}\n", "sla",
     "unknown metric"),
    ("name: t\n" + BASE + MIX % json.dumps("chat" + chr(10)), "workload.mix.0.name",
     "letters, digits"),
    ("name: t\n" + BASE + f"workloads: [{{name: {json.dumps('w' + chr(10))}}}]\n",
     "workloads.0.name", "pattern"),
])
def test_a_trailing_newline_is_refused_in_one_line(tmp_path: Path, text: str, key: str,
                                                   mentions: str) -> None:
    path = sweep(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert err.value.file == str(path)
    assert err.value.key == key or err.value.key.startswith(key + ".")
    assert mentions in str(err.value) and "\n" not in str(err.value)


def test_the_same_names_without_the_newline_load(tmp_path: Path) -> None:
    spec = load_sweep(sweep(tmp_path, "name: x\n" + BASE + "sla: {p99_ttft_ms: 5}\n"
                            + MIX % "chat"))
    assert (spec.name, spec.sla) == ("x", {"p99_ttft_ms": 5})
    assert spec.workload.mix is not None and spec.workload.mix[0].name == "chat"


@pytest.mark.parametrize(("key", "expected"), [
    ("chat.p99_ttft_ms", ("chat", "p99_ttft_ms")),
    ("chat\n.p99_ttft_ms", (None, "chat\n.p99_ttft_ms")),
    ("p99.9_itl_ms", (None, "p99.9_itl_ms")),
])
def test_split_class_key_takes_a_whole_class_name(key: str,
                                                  expected: tuple[str | None, str]) -> None:
    assert split_class_key(key) == expected


@pytest.mark.parametrize(("key", "parsed"), [
    ("p99_ttft_ms", True),
    ("p99_ttft_ms\n", False),
    ("mean_tpot_ms\n", False),
])
def test_parse_latency_key_takes_the_whole_key(key: str, parsed: bool) -> None:
    assert (parse_latency_key(key) is not None) is parsed
