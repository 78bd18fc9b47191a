"""Start-up levers (framework.engine.startup_levers): which apply to which trial, what they add
to its flags; the page-cache reader on real files; the sweep key's validation; inert on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from framework.cluster.page_cache import read_into_page_cache
from framework.cluster.page_cache import weight_files
from framework.config.specs import ServerSpec
from framework.engine.startup_levers import LEVERS
from framework.engine.startup_levers import plan_levers

ALL = LEVERS
FAST = ("fastsafetensors",)


DEFAULTS = ("compile_cache", "page_cache", "load_format")


@pytest.mark.parametrize(("enabled", "engine", "flags", "installed", "added", "names"), [
    # FakeEngine: every lever inert; CPU: all but warm_start (vLLM's CPU platform spawns)
    (ALL, "fake", {"max-num-seqs": 8}, FAST, {}, ()),
    (ALL, "cpu", {"max-num-seqs": 8}, FAST, {}, ("warm_start",)),
    (ALL[:5], "cpu", {"max-num-seqs": 8}, FAST, {}, ()),
    (("warm_start",), "cpu", {"distributed-executor-backend": "ray"}, FAST, {}, ()),
    # vLLM's Ray executor (what TP x PP > 1 gets): the server stays in the actor, no fork
    (("fork_start",), "gpu", {"distributed-executor-backend": "ray"}, FAST, {}, ()),
    (("fork_start",), "gpu", {"distributed-executor-backend": "mp"}, FAST, {},
     ("fork_start",)),
    # GPU, graphs captured: capture sizes capped at max-num-seqs, loader picked when installed
    (ALL, "gpu", {"max-num-seqs": 64}, FAST,
     {"max-cudagraph-capture-size": 64, "load-format": "fastsafetensors"},
     ("cudagraph_sizes", "compile_cache", "page_cache", "load_format", "warm_start")),
    (ALL[:5], "gpu", {"max-num-seqs": 64}, (), {"max-cudagraph-capture-size": 64},
     ("cudagraph_sizes", "compile_cache", "page_cache", "fork_start")),
    # the defaults leave cudagraph_sizes out; nothing installed: no load format
    (DEFAULTS, "gpu", {"max-num-seqs": 64}, (), {}, ("compile_cache", "page_cache")),
    (ALL, "gpu", {"max-num-seqs": 64, "distributed-executor-backend": "ray"}, (),
     {"max-cudagraph-capture-size": 64}, ("cudagraph_sizes", "compile_cache", "page_cache")),
    # enforce-eager: no graphs, no compile
    (ALL[:4], "gpu", {"max-num-seqs": 64, "enforce-eager": True}, (), {}, ("page_cache",)),
    # -O0 compiles nothing either
    (ALL[:4], "gpu", {"max-num-seqs": 64, "optimization-level": 0}, (), {}, ("page_cache",)),
    # the user's own capture sizes win; no max-num-seqs: vLLM's default stays
    (ALL[:4], "gpu", {"max-num-seqs": 64, "cudagraph-capture-sizes": "[1, 2, 4]"}, (), {},
     ("compile_cache", "page_cache")),
    (ALL[:4], "gpu", {}, (), {}, ("compile_cache", "page_cache")),
    # dummy weights: nothing to read ahead, and the load format is the user's
    (ALL[:4], "gpu", {"load-format": "dummy"}, FAST, {}, ("compile_cache",)),
])
def test_plan_levers(enabled, engine, flags, installed, added, names):
    plan = plan_levers(enabled, engine=engine, flags=flags, installed=installed)
    assert dict(plan.flags) == added
    assert plan.names == names


def test_load_format_needs_safetensors():
    plan = plan_levers(ALL, engine="gpu", flags={}, installed=FAST, safetensors=False)
    assert "load_format" not in plan.names and "load-format" not in plan.flags


def test_server_spec_levers_are_validated():
    assert ServerSpec().startup_levers == DEFAULTS
    assert ServerSpec(startup_levers=[]).startup_levers == ()
    with pytest.raises(ValidationError, match="cudagraph_sizes"):
        ServerSpec(startup_levers=["graphs"])


def test_page_cache_reads_every_weight_file(tmp_path: Path):
    (tmp_path / "model.safetensors").write_bytes(b"x" * 5000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "part.bin").write_bytes(b"y" * 300)
    (tmp_path / "config.json").write_text("{}")
    assert [p.name for p in weight_files(tmp_path)] == ["model.safetensors", "part.bin"]
    assert read_into_page_cache(str(tmp_path)) == 5300
    assert read_into_page_cache(str(tmp_path / "missing")) == 0
