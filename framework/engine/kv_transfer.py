"""The KV connector of a prefill/decode deployment: which of vLLM's connectors, and the flag
both servers get (`--kv-transfer-config`, vllm/config/kv_transfer.py KVTransferConfig).

A registry by name (CONNECTORS), each entry stating where its KV goes:
- `ExampleConnector` (vllm/distributed/kv_transfer/kv_connector/v1/example_connector.py): the
  prefill server saves each request's KV as files in `shared_storage_path`; the decode server
  loads them from there. Runs on the CPU engine; both servers must see one folder (one node, or
  a file system every node mounts). It moves whole blocks of the prompt but its last token
  only (`align_to_block_size(len(prompt) - 1)`), and the CPU engine's default block is 128
  tokens (vllm/platforms/cpu.py): prompts of up to 129 tokens move nothing unless
  `block-size` is smaller (found here: a 1P1D trial of 128-token prompts moved 0 tokens at
  the default, and was failed kv_not_transferred).
- `NixlConnector` (.../v1/nixl_connector.py): GPU to GPU over NIXL, no shared folder.
Both servers run with `kv_role: kv_both` (each may save and load), as vLLM's own
disaggregated-serving examples do; which one prefills is the proxy's choice
(framework/engine/router.py, P/D mode).

What a decode server loaded is vLLM's `vllm:prompt_tokens_by_source_total` with
`source="external_kv_transfer"` (server_metrics.KV_TRANSFERRED): 0 means no KV crossed, and the
decode server computed every prompt itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

EXTERNAL_SOURCE = "external_kv_transfer"  # vllm/v1/metrics/loggers.py, prompt token sources


@dataclass(frozen=True)
class Connector:
    """One KV connector: whether its servers need a folder both see (`shared_folder`)."""

    name: str
    shared_folder: bool
    extra: Callable[[str | None], dict[str, str]]


def _example_extra(folder: str | None) -> dict[str, str]:
    if not folder:
        raise ValueError("ExampleConnector needs a folder both servers see (shared_storage_path)")
    return {"shared_storage_path": folder}


CONNECTORS: dict[str, Connector] = {
    "ExampleConnector": Connector("ExampleConnector", True, _example_extra),
    "NixlConnector": Connector("NixlConnector", False, lambda _: {}),
}


def default_connector(engine: str) -> str:
    """NIXL on GPUs; the shared-folder example connector where NIXL does not run (CPU, and
    FakeEngine, which fakes that connector's observable contract)."""
    return "NixlConnector" if engine == "gpu" else "ExampleConnector"


def kv_transfer_config(name: str, folder: str | None = None) -> str:
    """The `--kv-transfer-config` value of connector `name` (JSON, as vLLM parses it). Pure."""
    connector = CONNECTORS[name]
    config: dict[str, object] = {"kv_connector": connector.name, "kv_role": "kv_both"}
    extra = connector.extra(folder)
    if extra:
        config["kv_connector_extra_config"] = extra
    return json.dumps(config, separators=(",", ":"))


def kv_transfer_args(name: str, folder: str | None = None) -> list[str]:
    """The argv entries that give a server connector `name`."""
    return ["--kv-transfer-config", kv_transfer_config(name, folder)]
