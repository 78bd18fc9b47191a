"""What every server actor's environment gets from the launcher (cluster.launcher
RayLauncher._env_for): the node-local caches with `~` left for each node's $HOME, torch
inductor's cache beside them, and torch's precompiled kernel header off (it lives in the temp
dir, a server's private run folder, so it was built at every start: benchmarks/
precompiled_header.py), each unless the sweep's own server.env sets it. No Ray is started."""

from __future__ import annotations

import pytest

from framework.cluster.actors import CACHE_DIR_VAR
from framework.cluster.actors import INDUCTOR_CACHE_VAR
from framework.cluster.actors import PRECOMPILE_HEADERS_VAR
from framework.cluster.launcher import RayLauncher


@pytest.mark.parametrize(("sweep_env", "header", "inductor"), [
    ({CACHE_DIR_VAR: "~/.cache/vllm-sweep"}, "0", "${HOME}/.cache/vllm-sweep/inductor"),
    ({CACHE_DIR_VAR: "/data/cache/"}, "0", "/data/cache/inductor"),
    ({CACHE_DIR_VAR: "/data/cache", PRECOMPILE_HEADERS_VAR: "1",
      INDUCTOR_CACHE_VAR: "/other"}, "1", "/other"),
])
def test_a_server_gets_node_caches_and_no_precompiled_header_unless_the_sweep_says(
        sweep_env, header, inductor):
    launcher = RayLauncher(env=sweep_env, host="127.0.0.1", engine="cpu")
    env = launcher._env_for([{"CPU": 1}])
    assert env[PRECOMPILE_HEADERS_VAR] == header
    assert env[INDUCTOR_CACHE_VAR] == inductor
    assert env[CACHE_DIR_VAR].endswith(sweep_env[CACHE_DIR_VAR].lstrip("~"))
