"""Ray Serve LLM's application config for a shipped deployment (`export --format ray-serve`):
which of its builders serves the deployment's shape, and vLLM's flags as its engine kwargs.
Pure; framework/cluster/serve_llm.py checks the result with Ray's own classes.

Ray Serve LLM (ray/llm/_internal/serve/core/configs/llm_config.py, ray 2.60):
- `import_path: ray.serve.llm:build_openai_app`, `args.llm_configs`: one LLMConfig;
- `engine_kwargs`: vLLM's flags as AsyncEngineArgs field names (`max-num-seqs` -> `max_num_seqs`),
  without `distributed-executor-backend`, which Ray Serve LLM sets itself (ray for GPUs, mp on
  CPU: engines/vllm/vllm_models.py get_initialization_kwargs);
- `accelerator_type`: Ray's name of the GPU (RAY_ACCELERATORS); the CPU engine states
  `accelerator_config: {kind: cpu}` instead;
- `deployment_config.num_replicas`: the fleet's replicas (1 when the sweep sized none);
- with `data-parallel-size` > 1, `build_dp_openai_app`'s `llm_config`; with prefill servers,
  `build_pd_openai_app`'s `prefill_config` and `decode_config`, each with the KV connector
  (Deployment.roles splits the fleet's servers as the measured group was).
"""

from __future__ import annotations

from collections.abc import Mapping

from framework.base.vocabulary import Scalar
from framework.fleet.manifests import Deployment
from framework.fleet.manifests import dns_name

RAY_SERVE_BUILDER = "ray.serve.llm:build_openai_app"
# vLLM's data parallel as Ray Serve LLM runs it: one Serve replica per DP rank, gang-scheduled
# (ray/llm/_internal/serve/serving_patterns/data_parallel/builder.py, DPOpenAiServingArgs;
# dp_server.py: num_replicas counts DP groups and is multiplied by data_parallel_size).
RAY_SERVE_DP_BUILDER = "ray.serve.llm:build_dp_openai_app"
# Prefill/decode as Ray Serve LLM runs it: an ingress, decode deployments, prefill deployments
# (ray/llm/_internal/serve/serving_patterns/prefill_decode/builder.py, PDServingArgs: both
# configs of one model, each with a kv_transfer_config; its decode server asks the prefill
# server with max_tokens 1 and hands the answer's kv_transfer_params on, as NIXL needs).
RAY_SERVE_PD_BUILDER = "ray.serve.llm:build_pd_openai_app"
# memory_model.GPUS name -> Ray's accelerator type (ray/util/accelerators/accelerators.py)
RAY_ACCELERATORS = {
    "A100-80GB": "A100-80G", "A100-40GB": "A100-40G", "H100-80GB": "H100", "H200-141GB": "H200",
    "L40S-48GB": "L40S", "A10G-24GB": "A10G", "L4-24GB": "L4",
}
_SET_BY_RAY_SERVE = ("distributed-executor-backend",)


def engine_kwargs(flags: Mapping[str, Scalar | None]) -> dict[str, Scalar]:
    """vLLM flags -> AsyncEngineArgs keyword arguments (dashes to underscores; unset flags and
    the ones Ray Serve LLM sets itself left out)."""
    return {name.replace("-", "_"): value for name, value in flags.items()
            if value is not None and name not in _SET_BY_RAY_SERVE}


def ray_serve_app(d: Deployment) -> dict[str, object]:
    """The `serve run` config of one Ray Serve LLM application serving `d`: build_openai_app's
    llm_configs; with data-parallel-size > 1 build_dp_openai_app's llm_config (its
    num_replicas: DP groups); with prefill servers build_pd_openai_app's prefill_config and
    decode_config (num_replicas: `roles`, each with the KV connector's kv_transfer_config)."""
    def llm_config(replicas: int, extra: Mapping[str, object] | None = None) -> dict[str, object]:
        llm: dict[str, object] = {
            "model_loading_config": {"model_id": d.served_name, "model_source": d.model},
            "engine_kwargs": {**engine_kwargs(d.flags), **(extra or {})},
            "deployment_config": {"num_replicas": replicas},
        }
        if d.engine == "gpu" and d.gpu in RAY_ACCELERATORS:
            llm["accelerator_type"] = RAY_ACCELERATORS[d.gpu]
        elif d.engine != "gpu":
            llm["accelerator_config"] = {"kind": "cpu"}
        return llm

    args: dict[str, object]
    if d.prefill:
        prefill, decode = d.roles
        kv = {"kv_transfer_config": dict(d.kv_transfer or {})}
        builder, args = RAY_SERVE_PD_BUILDER, {"prefill_config": llm_config(prefill, kv),
                                               "decode_config": llm_config(decode, kv)}
    elif d.dp > 1:
        builder, args = RAY_SERVE_DP_BUILDER, {"llm_config": llm_config(d.replicas or 1)}
    else:
        builder, args = RAY_SERVE_BUILDER, {"llm_configs": [llm_config(d.replicas or 1)]}
    return {"applications": [{"name": dns_name(d.name), "route_prefix": "/",
                              "import_path": builder, "args": args}]}
