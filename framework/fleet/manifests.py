"""One shipped configuration as deployment files: a Kubernetes Deployment + Service, and what
every deployment file needs (Deployment; the Ray Serve LLM application is fleet/ray_serve.py).
Pure: plain dicts, dumped to YAML by the caller.

Kubernetes (k8s_manifests): a Deployment and a ClusterIP Service on the same port, built to pass a
platform team's review and the Pod Security Standard "restricted" profile:
- image: pinned, never `:latest` (image_for): `vllm/vllm-openai:v<vLLM>` on the GPU engine, vLLM's
  published CPU image `vllm/vllm-openai-cpu:v<vLLM>-x86_64` on the CPU engine (vLLM's docs,
  docs/getting_started/installation/cpu.x86.inc.md, "pre-built images"; `-arm64` for Arm
  nodes: name it with --image). An x86_64/arm64 image tag pins kubernetes.io/arch;
- the model (ModelSource): a Hugging Face hub id (with its revision when known), HF_TOKEN from a
  Secret (optional: public models need none); or a PersistentVolumeClaim mounted read-only at
  /models, the model folder inside it, HF_HUB_OFFLINE=1 and `--served-model-name` the folder's
  name (clients send what they sent to the sweep's servers, not the mount path);
- VLLM_API_KEY from a Secret (secretKeyRef, key `api-key`) when the deployment takes a key: the
  key itself is never in the file;
- security: pod runAsNonRoot as uid/gid 1000, seccompProfile RuntimeDefault, no
  service-account token (automountServiceAccountToken false: vLLM calls no Kubernetes API);
  the container with allowPrivilegeEscalation false, every capability dropped and a read-only
  root filesystem. vLLM writes caches (its compile cache in ~/.cache/vllm, Hugging Face's
  files, Triton's and FlashInfer's kernels, ~/.nv, its usage file in ~/.config) and temp files
  (torch inductor, ZMQ IPC sockets): HOME is an emptyDir at /home/vllm and /tmp another, each
  with a sizeLimit; nothing else of the image is written (not verified in a running container
  here). The CPU image's docs run it with SYS_NICE for NUMA memory binding; dropped here,
  libnuma's binding calls are refused by RuntimeDefault seccomp and the CPU engine runs without
  NUMA memory binding: a platform that allows SYS_NICE may add it back;
- resources (pod_size): requests = limits (Guaranteed QoS, so exclusive cores under the static
  CPU manager), the rule in pod_size's docstring; /dev/shm an emptyDir in memory with a
  sizeLimit, counted in the memory (tmpfs pages are charged to the pod);
- a readiness probe on /health (outside the API-key check, which guards /v1, /v2, /inference
  and /cohere: vllm/entrypoints/serve/middleware/authenticate.py), `replicas` from the fleet.
The `--served-model-name`, revision and port flags are added only where the sweep's flags do
not set them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field

from framework.base.vocabulary import Scalar

DEFAULT_PORT = 8000
GIB = 2**30
GPU_IMAGE = "vllm/vllm-openai"
CPU_IMAGE = "vllm/vllm-openai-cpu"  # vLLM's docs: installation/cpu.x86.inc.md, pre-built images
CPU_IMAGE_ARCH = "x86_64"
IMAGE_ARCHES = {"x86_64": "amd64", "arm64": "arm64"}  # image tag suffix -> kubernetes.io/arch
API_KEY_SECRET = "vllm-api-key"  # default Secret names and keys (vLLM's k8s guide's for HF)
API_KEY_SECRET_KEY = "api-key"
HF_TOKEN_SECRET = "hf-token-secret"
HF_TOKEN_SECRET_KEY = "token"
MODEL_CLAIM = "vllm-models"
MODEL_MOUNT = "/models"
HOME = "/home/vllm"
UID = 1000  # runAsUser / runAsGroup: the images run as root unless told otherwise
# pod_size's allowances (estimates, not measured here: see pod_size)
PROCESS_BYTES = 3 * GIB
SHM_BYTES_PER_WORKER = 1 * GIB
CACHE_BYTES = 10 * GIB
TMP_BYTES = 4 * GIB
LOG_BYTES = 1 * GIB


@dataclass(frozen=True)
class HubModel:
    """The model pulled from the Hugging Face hub at start-up (into HOME's emptyDir); HF_TOKEN
    from Secret `token_secret` (optional)."""

    repo_id: str
    revision: str | None = None
    token_secret: str = HF_TOKEN_SECRET


@dataclass(frozen=True)
class VolumeModel:
    """The model folder `path` inside PersistentVolumeClaim `claim`, mounted read-only at
    MODEL_MOUNT ("" = the claim's root is the model folder)."""

    claim: str = MODEL_CLAIM
    path: str = ""

    @property
    def mounted(self) -> str:
        return f"{MODEL_MOUNT}/{self.path}" if self.path else MODEL_MOUNT


ModelSource = HubModel | VolumeModel


@dataclass(frozen=True)
class PodSize:
    """One replica's resources (requests = limits) and its volumes' sizeLimits, in bytes
    except `cpu` (vCPUs). Disk-backed emptyDirs (HOME, /tmp) and the container log make the
    ephemeral storage; /dev/shm is memory and counted in `memory_bytes`."""

    cpu: int
    memory_bytes: int
    shm_bytes: int
    home_bytes: int
    tmp_bytes: int = TMP_BYTES

    @property
    def ephemeral_bytes(self) -> int:
        return self.home_bytes + self.tmp_bytes + LOG_BYTES


@dataclass(frozen=True)
class Deployment:
    """What a deployment file needs: `argv` is `vllm serve`'s arguments (model first, then the
    flags, engine.server_args); `replicas` None when no fleet was sized (no target or capacity).
    Kubernetes only: `source` where the pod reads the model (None: model_source(model)),
    `api_key_secret` the Secret holding VLLM_API_KEY (None: no key), `env` the servers'
    environment, `size` its resources (None: pod_size without the model's facts)."""

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
    source: ModelSource | None = None
    api_key_secret: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    size: PodSize | None = None
    dp: int = 1  # vLLM's data-parallel-size: DP engines in the one pod
    # prefill/decode: servers measured together (`servers`), of which `prefill` prefill
    # servers, every one with `kv_transfer` (vLLM's KVTransferConfig as a mapping)
    servers: int = 1
    prefill: int = 0
    kv_transfer: Mapping[str, object] | None = None

    @property
    def devices(self) -> int:
        """Devices of one replica (pod): TP x PP x DP."""
        return self.tp * self.pp * self.dp

    @property
    def roles(self) -> tuple[int, int]:
        """Prefill/decode: (prefill servers, decode servers) of the whole fleet, `replicas`
        (servers, in whole groups of `servers`) split as the measured group was."""
        groups = max(1, (self.replicas or self.servers) // self.servers)
        return groups * self.prefill, groups * (self.servers - self.prefill)


def image_for(engine: str, version: str | None) -> str:
    """vLLM's published image at `version` (a local `+cpu` tag dropped): the OpenAI server image
    on the GPU engine, the x86_64 CPU image otherwise. ValueError without a version: an
    unpinned image is never written."""
    text = (version or "").split("+", 1)[0].strip()
    if not text or text == "None":
        raise ValueError("the vLLM version is unknown: name a pinned image (--image)")
    if engine == "gpu":
        return f"{GPU_IMAGE}:v{text}"
    return f"{CPU_IMAGE}:v{text}-{CPU_IMAGE_ARCH}"


def image_problem(image: str) -> str | None:
    """Why `image` is not pinned (no tag, or `latest`), None when it is (a tag or a digest)."""
    if "@" in image:
        return None
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return "no tag: it means :latest; pin a version tag or a digest"
    if last.rsplit(":", 1)[1] == "latest":
        return ":latest is not pinned; pin a version tag or a digest"
    return None


def image_arch(image: str) -> str | None:
    """kubernetes.io/arch of an image whose tag ends in a known architecture (vLLM's CPU tags),
    else None (multi-arch or unknown: no node selector)."""
    tag = image.split("@", 1)[0].rsplit("/", 1)[-1].partition(":")[2]
    return next((arch for suffix, arch in IMAGE_ARCHES.items() if tag.endswith(f"-{suffix}")), None)


_HUB_CACHE = re.compile(r"(?:^|/)models--([^/]+)/snapshots/([0-9a-f]{40})/?$")


def hub_snapshot(path: str) -> tuple[str, str] | None:
    """(repo id, revision) when `path` is a snapshot folder of Hugging Face's hub cache
    (.../models--ORG--NAME/snapshots/<commit>; a repo name never holds "--"), else None."""
    m = _HUB_CACHE.search(path)
    return ("/".join(m.group(1).split("--")), m.group(2)) if m else None


def model_source(model: str, *, repo_id: str | None = None, claim: str | None = None,
                 path: str | None = None) -> ModelSource:
    """Where the pod reads the sweep's model from: `repo_id` given, that hub id (at the
    snapshot's revision when the model is that repo's hub-cache snapshot); `claim` given, that
    PVC; else a hub-cache snapshot's repo and revision; else PVC MODEL_CLAIM. On a PVC the
    model is `path` inside it (default: the model folder's name)."""
    snapshot = hub_snapshot(model)
    if repo_id is not None:
        return HubModel(repo_id, snapshot[1] if snapshot and snapshot[0] == repo_id else None)
    if claim is None and snapshot is not None:
        return HubModel(*snapshot)
    inside = model.rstrip("/").rsplit("/", 1)[-1] if path is None else path.strip("/")
    return VolumeModel(claim or MODEL_CLAIM, inside)


def pod_size(engine: str, workers: int, *, weights_bytes: int | None = None,
             kv_cache_bytes: int = 0, node_cpus: int | None = None,
             download_bytes: int = 0) -> PodSize:
    """One replica's resources from what the sweep knows. `workers` = TP x PP (GPUs, or the CPU
    engine's workers); vLLM runs 2 + workers processes (API server, engine core, one worker per
    device: vLLM's docs, design/arch_overview.md "Process Count Summary").
    - CPU: GPU engine 2 x (2 + workers) vCPUs, vLLM's minimum of 2 + N physical cores counted in
      hyperthreads (configuration/optimization.md, "CPU Resources for GPU Deployments"); CPU
      engine the logical cores of the node the sweep measured on (`node_cpus`, from the rows'
      `hardware`: its numbers came from those cores), that rule when unknown.
    - /dev/shm: SHM_BYTES_PER_WORKER x (workers + 1) (2 GiB at one worker, vLLM's k8s guide's
      figure; NCCL's and vLLM's shared-memory rings grow with the workers).
    - memory: the weights (`weights_bytes`, the model files: read through the page cache,
      which is charged to the pod, and held in RAM by the CPU engine) + `kv_cache_bytes` (CPU
      engine: VLLM_CPU_KVCACHE_SPACE per worker) + PROCESS_BYTES per process (torch and the
      CUDA runtime loaded; an allowance, not a measurement) + /dev/shm; whole GiB.
    - HOME: CACHE_BYTES for the compile and kernel caches + `download_bytes` (the weights, when
      they come from the hub); /tmp: TMP_BYTES."""
    processes = 2 + workers
    cpu = node_cpus if engine == "cpu" and node_cpus else 2 * processes
    shm = SHM_BYTES_PER_WORKER * (workers + 1)
    memory = (weights_bytes or 0) + kv_cache_bytes + PROCESS_BYTES * processes + shm
    return PodSize(cpu=cpu, memory_bytes=math.ceil(memory / GIB) * GIB, shm_bytes=shm,
                   home_bytes=CACHE_BYTES + download_bytes)


def gib(n_bytes: int) -> str:
    """A Kubernetes quantity in whole GiB, rounded up."""
    return f"{math.ceil(n_bytes / GIB)}Gi"


def dns_name(name: str) -> str:
    """A Kubernetes object name (RFC 1123 label): lower case, [a-z0-9-], at most 63, starting
    and ending alphanumeric; "vllm" when nothing is left."""
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:63].rstrip("-")
    return label or "vllm"


_OFFLINE = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def _secret_env(name: str, secret: str, key: str, optional: bool) -> dict[str, object]:
    ref: dict[str, object] = {"name": secret, "key": key}
    if optional:
        ref["optional"] = True
    return {"name": name, "valueFrom": {"secretKeyRef": ref}}


def k8s_args(d: Deployment, source: ModelSource) -> list[str]:
    """`vllm serve`'s arguments in the pod: the model where the pod reads it, the sweep's
    flags, then what they leave unset: the hub revision, the served name of a mounted folder,
    the port."""
    model = source.repo_id if isinstance(source, HubModel) else source.mounted
    args = [model, *d.argv[1:]]
    if isinstance(source, HubModel) and source.revision and "revision" not in d.flags:
        args += ["--revision", source.revision]
    if isinstance(source, VolumeModel) and not d.flags.get("served-model-name"):
        args += ["--served-model-name", d.served_name]
    return [*args, "--port", str(d.port)]


def k8s_env(d: Deployment, source: ModelSource) -> list[dict[str, object]]:
    """HOME on its emptyDir, the servers' environment (a hub model: without the offline
    switches, it is downloaded), offline on a mounted model, then the secrets by reference:
    VLLM_API_KEY (required) and a hub model's HF_TOKEN (optional)."""
    env: list[dict[str, object]] = [{"name": "HOME", "value": HOME}]
    if isinstance(source, VolumeModel):
        values = {"HF_HUB_OFFLINE": "1", **d.env}
    else:
        values = {k: v for k, v in d.env.items() if k not in _OFFLINE}
    env += [{"name": k, "value": v} for k, v in values.items() if k != "HOME"]
    if d.api_key_secret:
        env.append(_secret_env("VLLM_API_KEY", d.api_key_secret, API_KEY_SECRET_KEY, False))
    if isinstance(source, HubModel):
        env.append(_secret_env("HF_TOKEN", source.token_secret, HF_TOKEN_SECRET_KEY, True))
    return env


def k8s_manifests(d: Deployment) -> list[dict[str, object]]:
    """[Deployment, Service] (apps/v1, v1) for `d` (module docstring)."""
    name = dns_name(d.name)
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "vllm-sweep"}
    devices = d.devices
    source = d.source or model_source(d.model)
    size = d.size or pod_size(d.engine, devices)
    amounts: dict[str, str] = {"cpu": str(size.cpu), "memory": gib(size.memory_bytes),
                               "ephemeral-storage": gib(size.ephemeral_bytes)}
    if d.engine == "gpu":
        amounts["nvidia.com/gpu"] = str(devices)
    mounts: list[dict[str, object]] = [
        {"name": "shm", "mountPath": "/dev/shm"}, {"name": "home", "mountPath": HOME},
        {"name": "tmp", "mountPath": "/tmp"}]
    volumes: list[dict[str, object]] = [
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": gib(size.shm_bytes)}},
        {"name": "home", "emptyDir": {"sizeLimit": gib(size.home_bytes)}},
        {"name": "tmp", "emptyDir": {"sizeLimit": gib(size.tmp_bytes)}}]
    if isinstance(source, VolumeModel):
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": source.claim,
                                                                    "readOnly": True}})
    container: dict[str, object] = {
        "name": "vllm",
        "image": d.image,
        "command": ["vllm", "serve"],
        "args": k8s_args(d, source),
        "env": k8s_env(d, source),
        "ports": [{"name": "http", "containerPort": d.port}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": d.port},
                           "periodSeconds": 10, "failureThreshold": 3},
        "resources": {"requests": dict(amounts), "limits": dict(amounts)},
        "securityContext": {"allowPrivilegeEscalation": False, "privileged": False,
                            "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": mounts,
    }
    pod: dict[str, object] = {
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": volumes,
    }
    if (arch := image_arch(d.image)) is not None:
        pod["nodeSelector"] = {"kubernetes.io/arch": arch}
    if d.engine == "gpu":  # GPU nodes are commonly tainted so; the toleration only allows
        pod["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists",
                               "effect": "NoSchedule"}]
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


def k8s_notes(d: Deployment) -> list[str]:
    """What must exist before `kubectl apply`, and how the resources were sized: comment lines
    for the head of the file (no secret value in them)."""
    source = d.source or model_source(d.model)
    size = d.size or pod_size(d.engine, d.devices)
    lines = [f"image {d.image}"]
    if d.api_key_secret:
        lines.append(f"kubectl create secret generic {d.api_key_secret} "
                     f"--from-literal={API_KEY_SECRET_KEY}=\"$YOUR_KEY\"  # VLLM_API_KEY; "
                     "clients send it as a Bearer token")
    if isinstance(source, HubModel):
        at = f" at revision {source.revision}" if source.revision else ""
        lines.append(f"model {source.repo_id}{at} from the Hugging Face hub; for a gated model: "
                     f"kubectl create secret generic {source.token_secret} "
                     f"--from-literal={HF_TOKEN_SECRET_KEY}=\"$HF_TOKEN\"")
    else:
        where = f"folder {source.path}/ inside it" if source.path else "the model at its root"
        lines.append(f"PersistentVolumeClaim {source.claim} holding the model ({where}), "
                     f"readable by uid {UID}; mounted read-only at {MODEL_MOUNT}")
    device = f"{d.devices} x nvidia.com/gpu, " if d.engine == "gpu" else ""
    lines.append(f"per replica (requests = limits): {device}{size.cpu} CPU, "
                 f"{gib(size.memory_bytes)} memory (/dev/shm {gib(size.shm_bytes)} included), "
                 f"{gib(size.ephemeral_bytes)} ephemeral storage: framework/fleet/manifests.py "
                 "pod_size")
    return lines
