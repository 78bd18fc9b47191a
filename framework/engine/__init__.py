"""The server side of a trial, without Ray: vLLM's OpenAI server in-process
(`vllm_server`) and its named stand-in (`fake_engine`), one contract for both; the server's
control socket (`control`); argv and the pasteable command (`server_args`); flag names
against the installed vLLM (`flag_check`); the server's /metrics (`server_metrics`); the
model's shape (`model_info`) and vLLM's memory accounting (`memory_model`, `feasibility`)."""
