"""What a server never inherits (#33 item 4): vLLM's API key and dev mode are dropped from the
environment a server actor (and the warm-start zygote) got from a private Ray's driver."""

from __future__ import annotations

from framework.cluster.actors import DROPPED_ENV
from framework.cluster.actors import drop_inherited


def test_the_api_key_and_dev_mode_are_dropped_and_nothing_else():
    environ = {"VLLM_API_KEY": "driver-key", "VLLM_SERVER_DEV_MODE": "1", "HF_HUB_OFFLINE": "1",
               "VLLM_CPU_KVCACHE_SPACE": "1"}
    drop_inherited(environ)
    assert environ == {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    assert set(DROPPED_ENV) == {"VLLM_API_KEY", "VLLM_SERVER_DEV_MODE"}
    drop_inherited(environ)  # absent: nothing to do
    assert environ == {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
