"""The load: datasets and arrivals (`workload`), the one HTTP client every request to a
server goes through (`http_client`), the streaming OpenAI client whose failures are data
(`loadgen`), the pure `vllm bench serve` metrics (`metrics`) and `vllm-sweep bench` (`bench`).
Raw timings (`loadgen.RequestRecord`) stay apart from statistics (`metrics`). Imports only
`base` and `config`."""
