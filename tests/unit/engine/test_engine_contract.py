"""One contract, two engines: vLLM's real OpenAI server (framework.engine.vllm_server) and FakeEngine, the
named stand-in used for scheduling tests at scale. Both must reject bad flags as invalid_args
before listening, serve /health and streaming completions with usage (and /v1 only with the
API key when VLLM_API_KEY is set), count prefix-cache hits on a repeated prompt and forget them
after the in-process reset (the control socket, framework.engine.control) while vLLM's dev routes stay
closed (no VLLM_SERVER_DEV_MODE), and leave no process once their process group is killed."""

from __future__ import annotations

import importlib
import socket

import pytest

from framework.base.errors import TrialError
from framework.cluster.ports import pick_port
from tests.engines import ENGINES


@pytest.mark.parametrize("module", ENGINES)
@pytest.mark.parametrize("bad", [["--no-such-flag", "1"], ["--max-num-seqs", "many"]])
def test_bad_flags_are_invalid_args_before_listening(module, bad, tiny_model):
    serve = importlib.import_module(module).serve
    port = pick_port("127.0.0.1", [])
    with pytest.raises(TrialError) as err:
        serve(["--model", str(tiny_model), "--port", str(port), *bad])
    assert err.value.reason == "invalid_args"
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0, "nothing may listen after a rejection"
