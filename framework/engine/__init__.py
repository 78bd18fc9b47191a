"""The server side of a trial, without Ray: vLLM's OpenAI server in-process
(`vllm_server`) and its named stand-in (`fake_engine`), one contract for both; the server's
control socket (`control`); argv and the pasteable command (`server_args`); flag names
and values against the installed vLLM (`flag_check`); the server's /metrics (`server_metrics`); the
model's shape (`model_info`) and vLLM's memory accounting (`memory_model`, `feasibility`)."""

from framework.base.exports import lazy_exports

__getattr__, __all__ = lazy_exports(__name__, {
    "serve": "vllm_server",
    "startup_failure": "vllm_server",
    "server_argv": "server_args",
    "serve_command": "server_args",
    "trial_flags": "server_args",
    "Feasibility": "feasibility",
    "check": "feasibility",
    "check_cpu": "feasibility",
    "GPUS": "feasibility",
    "MetricsSampler": "server_metrics",
    "ControlServer": "control",
})
