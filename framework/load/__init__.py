"""The load: datasets and arrivals (`workload`), the one HTTP client every request to a
server goes through (`http_client`), the streaming OpenAI client whose failures are data
(`loadgen`), the pure `vllm bench serve` metrics (`metrics`) and `vllm-sweep bench` (`bench`).
Raw timings (`loadgen.RequestRecord`) stay apart from statistics (`metrics`). Imports only
`base` and `config`."""

from framework.base.exports import lazy_exports

__getattr__, __all__ = lazy_exports(__name__, {
    "RequestSpec": "prompts",
    "load_tokenizer": "prompts",
    "Dataset": "workload",
    "arrival_offsets": "workload",
    "RequestRecord": "loadgen",
    "LoadResult": "loadgen",
    "run_load": "loadgen",
    "wait_ready": "loadgen",
    "compute_metrics": "metrics",
    "ConnectionPool": "http_client",
    "get": "http_client",
    "get_sync": "http_client",
})
