"""One shipped configuration as deployment files: a Ray Serve LLM application (`serve run`
config) and a Kubernetes Deployment + Service. Pure: plain dicts, dumped to YAML by the caller.

Ray Serve LLM (ray/llm/_internal/serve/core/configs/llm_config.py, ray 2.60):
- `import_path: ray.serve.llm:build_openai_app`, `args.llm_configs`: one LLMConfig;
- `engine_kwargs`: vLLM's flags as AsyncEngineArgs field names (`max-num-seqs` -> `max_num_seqs`),
  without `distributed-executor-backend`, which Ray Serve LLM sets itself (ray for GPUs, mp on
  CPU: engines/vllm/vllm_models.py get_initialization_kwargs);
- `accelerator_type`: Ray's name of the GPU (RAY_ACCELERATORS); the CPU engine states
  `accelerator_config: {kind: cpu}` instead;
- `deployment_config.num_replicas`: the fleet's replicas (1 when the sweep sized none).

Kubernetes: the vllm/vllm-openai image running `vllm serve <model> <flags> --port <port>`,
`resources.limits["nvidia.com/gpu"] = TP x PP` on the GPU engine, a readiness probe on /health,
/dev/shm in memory when TP x PP > 1 (vLLM's workers share tensors through it), `replicas` from the
fleet, and a ClusterIP Service on the same port.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from framework.base.vocabulary import Scalar

RAY_SERVE_BUILDER = "ray.serve.llm:build_openai_app"
DEFAULT_PORT = 8000
# memory_model.GPUS name -> Ray's accelerator type (ray/util/accelerators/accelerators.py)
RAY_ACCELERATORS = {
    "A100-80GB": "A100-80G", "A100-40GB": "A100-40G", "H100-80GB": "H100", "H200-141GB": "H200",
    "L40S-48GB": "L40S", "A10G-24GB": "A10G", "L4-24GB": "L4",
}
_SET_BY_RAY_SERVE = ("distributed-executor-backend",)


@dataclass(frozen=True)
class Deployment:
    """What a deployment file needs: `argv` is `vllm serve`'s arguments (model first, then the
    flags, engine.server_args); `replicas` None when no fleet was sized (no target or capacity)."""

    name: str
    model: str
    served_name: str  # the model name clients send (vLLM's served-model-name)
    flags: Mapping[str, Scalar | None]
    argv: tuple[str, ...]
    engine: str
    gpu: str | None
    tp: int
    pp: int
    replicas: int | None
    image: str
    port: int = DEFAULT_PORT


def dns_name(name: str) -> str:
    """A Kubernetes object name (RFC 1123 label): lower case, [a-z0-9-], at most 63, starting
    and ending alphanumeric; "vllm" when nothing is left."""
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:63].rstrip("-")
    return label or "vllm"


def engine_kwargs(flags: Mapping[str, Scalar | None]) -> dict[str, Scalar]:
    """vLLM flags -> AsyncEngineArgs keyword arguments (dashes to underscores; unset flags and
    the ones Ray Serve LLM sets itself left out)."""
    return {name.replace("-", "_"): value for name, value in flags.items()
            if value is not None and name not in _SET_BY_RAY_SERVE}


def ray_serve_app(d: Deployment) -> dict[str, object]:
    """The `serve run` config of one Ray Serve LLM application serving `d`."""
    llm: dict[str, object] = {
        "model_loading_config": {"model_id": d.served_name, "model_source": d.model},
        "engine_kwargs": engine_kwargs(d.flags),
        "deployment_config": {"num_replicas": d.replicas or 1},
    }
    if d.engine == "gpu" and d.gpu in RAY_ACCELERATORS:
        llm["accelerator_type"] = RAY_ACCELERATORS[d.gpu]
    elif d.engine != "gpu":
        llm["accelerator_config"] = {"kind": "cpu"}
    return {"applications": [{"name": dns_name(d.name), "route_prefix": "/",
                              "import_path": RAY_SERVE_BUILDER,
                              "args": {"llm_configs": [llm]}}]}


def k8s_manifests(d: Deployment) -> list[dict[str, object]]:
    """[Deployment, Service] (apps/v1, v1) for `d`."""
    name = dns_name(d.name)
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "vllm-sweep"}
    devices = d.tp * d.pp
    container: dict[str, object] = {
        "name": "vllm",
        "image": d.image,
        "command": ["vllm", "serve"],
        "args": [*d.argv, "--port", str(d.port)],
        "ports": [{"name": "http", "containerPort": d.port}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": d.port},
                           "periodSeconds": 10, "failureThreshold": 3},
    }
    if d.engine == "gpu":
        container["resources"] = {"limits": {"nvidia.com/gpu": devices}}
    pod: dict[str, object] = {"containers": [container]}
    if devices > 1:
        container["volumeMounts"] = [{"name": "shm", "mountPath": "/dev/shm"}]
        pod["volumes"] = [{"name": "shm", "emptyDir": {"medium": "Memory"}}]
    deployment: dict[str, object] = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"replicas": d.replicas or 1, "selector": {"matchLabels": dict(labels)},
                 "template": {"metadata": {"labels": dict(labels)}, "spec": pod}},
    }
    service: dict[str, object] = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"selector": dict(labels), "type": "ClusterIP",
                 "ports": [{"name": "http", "port": d.port, "targetPort": d.port}]},
    }
    return [deployment, service]
