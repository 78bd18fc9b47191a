"""vllm-sweep: SLA-constrained tuning of vLLM serving configurations on Ray."""

__version__ = "0.1.0"
