"""Whom a server's stop asks to shut down (cluster.node_reap.shutdown_targets): vLLM's top
process below the server actor, never every process alike; and where the server's vLLM IPC
sockets go (cluster.actors.rpc_base), so that the stop can remove them."""

from __future__ import annotations

from pathlib import Path

import pytest

from framework.cluster.actors import RPC_BASE_VAR
from framework.cluster.actors import rpc_base
from framework.cluster.node_reap import shutdown_targets

ACTOR = 100


@pytest.mark.parametrize(("parents", "group", "expected"), [
    # API server in the actor: EngineCore (its child) stops its worker itself
    ({200: ACTOR, 300: 200}, None, [200]),
    # fork_start: the API server is the actor's child; EngineCore and worker below it
    ({200: ACTOR, 300: 200, 400: 300}, None, [200]),
    # warm_start: API server, EngineCore and worker are all forks of the zygote (pid 50);
    # only the API server, the leader of the served group, gets the signal
    ({150: 50, 160: 50, 170: 50, 161: 160}, 150, [150]),
    # nothing below the actor (the fake engine, or a server already gone)
    ({}, None, []),
])
def test_only_the_top_vllm_process_is_signalled(parents, group, expected) -> None:
    assert shutdown_targets(ACTOR, parents, group) == expected


@pytest.mark.parametrize(("argv", "environ", "expected"), [
    (["serve", "m"], {}, "vsweep-rpc-7"),
    (["serve", "m", "--distributed-executor-backend", "ray"], {}, None),   # other nodes lack it
    (["serve", "m", "--distributed-executor-backend=ray"], {}, None),
    (["serve", "m", "--distributed-executor-backend", "mp"], {}, "vsweep-rpc-7"),
    (["serve", "m"], {RPC_BASE_VAR: "/srv/ipc"}, None),                      # server.env's own
])
def test_vllm_ipc_sockets_go_in_the_servers_folder_unless_the_ray_executor_runs(
        argv, environ, expected) -> None:
    base = rpc_base(argv, environ, 7)
    assert (base if base is None else Path(base).name) == expected
