"""The Kubernetes builders of framework.fleet.manifests, table-tested (#33 item 8): the pinned
image, where the model comes from, the pod's size rule, its arguments, environment and secret
references, the notes at the head of the file; every variant accepted by Kubernetes' own schema
(kubernetes-validate, strict) and by the Pod Security Standard "restricted" profile, checked
rule by rule as kubernetes.io/docs/concepts/security/pod-security-standards states it."""

from __future__ import annotations

import kubernetes_validate
import pytest

from framework.fleet.manifests import GIB
from framework.fleet.manifests import Deployment
from framework.fleet.manifests import HubModel
from framework.fleet.manifests import PodSize
from framework.fleet.manifests import VolumeModel
from framework.fleet.manifests import gib
from framework.fleet.manifests import hub_snapshot
from framework.fleet.manifests import image_arch
from framework.fleet.manifests import image_for
from framework.fleet.manifests import image_problem
from framework.fleet.manifests import k8s_args
from framework.fleet.manifests import k8s_env
from framework.fleet.manifests import k8s_manifests
from framework.fleet.manifests import k8s_notes
from framework.fleet.manifests import model_source
from framework.fleet.manifests import pod_size

K8S_VERSION = "1.33.0"
REV = "0123456789abcdef0123456789abcdef01234567"
SNAPSHOT = f"/root/.cache/huggingface/hub/models--meta-llama--Llama-3.1-8B/snapshots/{REV}"


def plan(engine: str = "gpu", tp: int = 1, pp: int = 1, *, source=None, secret=None,
         env=None, size=None, flags=None, image=None) -> Deployment:
    flags = {"max-num-seqs": 16} if flags is None else flags
    return Deployment(
        name="Llama_8B on H100", model="/data/models/llama", served_name="llama", flags=flags,
        argv=("/data/models/llama", "--max-num-seqs", "16"), engine=engine,
        gpu="H100-80GB" if engine == "gpu" else None, tp=tp, pp=pp, replicas=2,
        image=image or image_for(engine, "0.32.0"), source=source, api_key_secret=secret,
        env=env or {}, size=size)


# --- the Pod Security Standard "restricted" profile (its baseline rules included) -------------

RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}


def restricted_problems(pod: dict) -> list[str]:
    """Each rule of the restricted profile that `pod` (a PodSpec) breaks."""
    out = [f"host namespace {k}" for k in ("hostNetwork", "hostPID", "hostIPC") if pod.get(k)]
    pod_sc = pod.get("securityContext", {})
    for v in pod.get("volumes", []):
        kind = next(k for k in v if k != "name")
        if kind not in RESTRICTED_VOLUMES:
            out.append(f"volume type {kind}")
    if pod_sc.get("runAsUser") == 0:
        out.append("pod runAsUser 0")
    for c in pod["containers"]:
        sc = c.get("securityContext", {})
        if sc.get("privileged"):
            out.append("privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append("allowPrivilegeEscalation not false")
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
            out.append("runAsNonRoot not true")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            out.append("runAsUser 0")
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"seccompProfile {seccomp}")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            out.append("capabilities not dropping ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"capabilities added {caps['add']}")
        if any("hostPort" in p for p in c.get("ports", [])):
            out.append("hostPort")
    return out


def test_the_restricted_check_catches_what_it_should():
    deployment, _ = k8s_manifests(plan())
    pod = deployment["spec"]["template"]["spec"]
    assert restricted_problems(pod) == []
    (c,) = pod["containers"]
    c["securityContext"] = {"capabilities": {"add": ["SYS_NICE"]}}
    pod["securityContext"] = {"runAsUser": 0}
    pod["volumes"].append({"name": "h", "hostPath": {"path": "/"}})
    assert restricted_problems(pod) == [
        "volume type hostPath", "pod runAsUser 0", "allowPrivilegeEscalation not false",
        "runAsNonRoot not true", "runAsUser 0", "seccompProfile None",
        "capabilities not dropping ALL", "capabilities added ['SYS_NICE']"]


# --- the image ----------------------------------------------------------------------------------

@pytest.mark.parametrize("engine, version, image", [
    ("gpu", "0.32.0", "vllm/vllm-openai:v0.32.0"),
    ("gpu", "0.32.0+cu129", "vllm/vllm-openai:v0.32.0"),     # a local build tag dropped
    ("cpu", "0.32.0+cpu", "vllm/vllm-openai-cpu:v0.32.0-x86_64"),  # vLLM's published CPU image
    ("fake", "0.32.0", "vllm/vllm-openai-cpu:v0.32.0-x86_64"),
])
def test_image_for(engine, version, image):
    assert image_for(engine, version) == image


@pytest.mark.parametrize("version", [None, "", "None", "+cpu"])
def test_no_version_no_image(version):
    with pytest.raises(ValueError, match="pinned image"):
        image_for("gpu", version)


@pytest.mark.parametrize("image, problem", [
    ("vllm/vllm-openai:v0.32.0", None),
    ("registry.example:5000/team/vllm:v0.32.0-patched", None),  # a port is not a tag
    ("vllm/vllm-openai@sha256:" + "a" * 64, None),               # a digest pins
    ("vllm/vllm-openai", "no tag"),
    ("registry.example:5000/team/vllm", "no tag"),
    ("vllm/vllm-openai:latest", ":latest is not pinned"),
])
def test_image_problem(image, problem):
    found = image_problem(image)
    assert (found is None) if problem is None else (problem in found)


@pytest.mark.parametrize("image, arch", [
    ("vllm/vllm-openai-cpu:v0.32.0-x86_64", "amd64"),
    ("vllm/vllm-openai-cpu:v0.32.0-arm64", "arm64"),
    ("vllm/vllm-openai:v0.32.0", None),                  # multi-arch: no node selector
    ("registry.example:5000/x86_64/vllm:v1", None),
])
def test_image_arch(image, arch):
    assert image_arch(image) == arch


# --- where the model comes from -------------------------------------------------------------------

@pytest.mark.parametrize("path, found", [
    (SNAPSHOT, ("meta-llama/Llama-3.1-8B", REV)),
    (SNAPSHOT + "/", ("meta-llama/Llama-3.1-8B", REV)),
    (f"/hf/hub/models--gpt2/snapshots/{REV}", ("gpt2", REV)),  # a repo without an org
    (f"/hf/hub/models--Qwen--Qwen3-0.6B/snapshots/{REV}/sub", None),
    ("/data/models/llama", None),
    ("models/tiny-llama", None),
])
def test_hub_snapshot(path, found):
    assert hub_snapshot(path) == found


@pytest.mark.parametrize("model, kwargs, source", [
    ("/data/models/llama", {}, VolumeModel("vllm-models", "llama")),   # the default claim
    ("/data/models/llama/", {}, VolumeModel("vllm-models", "llama")),
    ("/data/models/llama", {"claim": "weights"}, VolumeModel("weights", "llama")),
    ("/data/models/llama", {"claim": "weights", "path": "/team/llama-8b/"},
     VolumeModel("weights", "team/llama-8b")),
    ("/data/models/llama", {"claim": "weights", "path": ""}, VolumeModel("weights", "")),
    ("/data/models/llama", {"repo_id": "meta-llama/Llama-3.1-8B"},
     HubModel("meta-llama/Llama-3.1-8B")),                             # revision unknown
    (SNAPSHOT, {}, HubModel("meta-llama/Llama-3.1-8B", REV)),         # the hub cache: its id
    (SNAPSHOT, {"repo_id": "meta-llama/Llama-3.1-8B"}, HubModel("meta-llama/Llama-3.1-8B", REV)),
    (SNAPSHOT, {"repo_id": "org/other"}, HubModel("org/other")),      # not that repo's revision
    (SNAPSHOT, {"claim": "weights"}, VolumeModel("weights", REV)),    # a claim asked for wins
])
def test_model_source(model, kwargs, source):
    assert model_source(model, **kwargs) == source


def test_a_mounted_model_path():
    assert VolumeModel("c", "team/llama").mounted == "/models/team/llama"
    assert VolumeModel("c", "").mounted == "/models"


# --- the pod's size ----------------------------------------------------------------------------

@pytest.mark.parametrize("engine, workers, kwargs, cpu, memory_gib, shm_gib, home_gib", [
    # GPU: 2 x (2 + N) vCPUs; memory = weights + 3 GiB x (2 + N) + shm; shm = 1 GiB x (N + 1)
    ("gpu", 1, {"weights_bytes": 16 * GIB}, 6, 16 + 9 + 2, 2, 10),
    ("gpu", 4, {"weights_bytes": 140 * GIB}, 12, 140 + 18 + 5, 5, 10),
    ("gpu", 8, {"weights_bytes": 140 * GIB}, 20, 140 + 30 + 9, 9, 10),
    ("gpu", 1, {"weights_bytes": 16 * GIB, "node_cpus": 96}, 6, 27, 2, 10),  # cores: CPU only
    ("gpu", 1, {}, 6, 9 + 2, 2, 10),                                    # weights unknown
    ("gpu", 1, {"weights_bytes": GIB // 2}, 6, 12, 2, 10),              # 11.5 GiB -> 12
    ("gpu", 1, {"weights_bytes": 16 * GIB, "download_bytes": 16 * GIB}, 6, 27, 2, 26),  # hub
    # CPU: the measured node's cores; its KV cache in RAM
    ("cpu", 1, {"weights_bytes": GIB, "kv_cache_bytes": GIB, "node_cpus": 16}, 16, 1 + 1 + 9 + 2,
     2, 10),
    ("cpu", 2, {"weights_bytes": GIB, "kv_cache_bytes": 2 * GIB, "node_cpus": 16}, 16,
     1 + 2 + 12 + 3, 3, 10),
    ("cpu", 1, {"weights_bytes": GIB, "kv_cache_bytes": GIB}, 6, 13, 2, 10),  # cores unknown
])
def test_pod_size(engine, workers, kwargs, cpu, memory_gib, shm_gib, home_gib):
    size = pod_size(engine, workers, **kwargs)
    assert size == PodSize(cpu=cpu, memory_bytes=memory_gib * GIB, shm_bytes=shm_gib * GIB,
                           home_bytes=home_gib * GIB, tmp_bytes=4 * GIB)
    assert size.ephemeral_bytes == (home_gib + 4 + 1) * GIB  # HOME + /tmp + the log


@pytest.mark.parametrize("n_bytes, text", [(GIB, "1Gi"), (GIB + 1, "2Gi"), (27 * GIB, "27Gi")])
def test_gib(n_bytes, text):
    assert gib(n_bytes) == text


# --- arguments, environment, secrets --------------------------------------------------------------

@pytest.mark.parametrize("source, flags, tail", [
    (VolumeModel("c", "llama"), {}, ["/models/llama", "--max-num-seqs", "16",
                                     "--served-model-name", "llama", "--port", "8000"]),
    (VolumeModel("c", "llama"), {"served-model-name": "chat"},   # the sweep's own name kept
     ["/models/llama", "--max-num-seqs", "16", "--port", "8000"]),
    (HubModel("org/m", REV), {}, ["org/m", "--max-num-seqs", "16", "--revision", REV,
                                  "--port", "8000"]),
    (HubModel("org/m", REV), {"revision": "main"}, ["org/m", "--max-num-seqs", "16",
                                                    "--port", "8000"]),
    (HubModel("org/m"), {}, ["org/m", "--max-num-seqs", "16", "--port", "8000"]),
])
def test_k8s_args(source, flags, tail):
    assert k8s_args(plan(flags=flags), source) == tail


KEY_REF = {"name": "VLLM_API_KEY",
           "valueFrom": {"secretKeyRef": {"name": "vllm-api-key", "key": "api-key"}}}
TOKEN_REF = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
    "name": "hf-token-secret", "key": "token", "optional": True}}}


@pytest.mark.parametrize("source, secret, env, expected", [
    (VolumeModel("c", "m"), None, {}, {"HOME": "/home/vllm", "HF_HUB_OFFLINE": "1"}),
    (VolumeModel("c", "m"), "vllm-api-key", {"VLLM_CPU_KVCACHE_SPACE": "1"},
     {"HOME": "/home/vllm", "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
      "VLLM_API_KEY": KEY_REF}),
    (HubModel("org/m"), None, {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "A": "b"},
     {"HOME": "/home/vllm", "A": "b", "HF_TOKEN": TOKEN_REF}),  # a hub model is downloaded
    (HubModel("org/m"), "vllm-api-key", {"HOME": "/elsewhere"},
     {"HOME": "/home/vllm", "VLLM_API_KEY": KEY_REF, "HF_TOKEN": TOKEN_REF}),  # HOME is ours
])
def test_k8s_env(source, secret, env, expected):
    got = k8s_env(plan(secret=secret, env=env), source)
    assert {e["name"]: e.get("value", e) for e in got} == expected
    assert len({e["name"] for e in got}) == len(got)


# --- the manifests, whole ---------------------------------------------------------------------------

VARIANTS = {
    "gpu, mounted model, key": dict(engine="gpu", tp=1, source=VolumeModel("vllm-models", "llama"),
                                    secret="vllm-api-key"),
    "gpu TP 2 x PP 2, hub model": dict(engine="gpu", tp=2, pp=2,
                                       source=HubModel("meta-llama/Llama-3.1-8B", REV)),
    "cpu, mounted at the root": dict(engine="cpu", source=VolumeModel("weights", ""),
                                     env={"VLLM_CPU_KVCACHE_SPACE": "1"}),
    "cpu TP 2, no source or size given": dict(engine="cpu", tp=2),
    "gpu, digest image": dict(engine="gpu", image="vllm/vllm-openai@sha256:" + "a" * 64),
}


@pytest.mark.parametrize("variant", VARIANTS, ids=list(VARIANTS))
def test_k8s_manifests_are_valid_and_restricted(variant):
    kwargs = VARIANTS[variant]
    d = plan(**kwargs)
    deployment, service = k8s_manifests(d)
    for doc in (deployment, service):  # raises kubernetes_validate.ValidationError when not
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    pod = deployment["spec"]["template"]["spec"]
    assert restricted_problems(pod) == []
    assert pod["automountServiceAccountToken"] is False
    (c,) = pod["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert ":latest" not in c["image"] and c["image"] == d.image
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert set(volumes) == set(mounts)
    # writable: /dev/shm (memory), HOME and /tmp, each bounded
    assert volumes["shm"]["emptyDir"]["medium"] == "Memory" and mounts["shm"]["mountPath"] == "/dev/shm"
    assert mounts["home"]["mountPath"] == "/home/vllm" and mounts["tmp"]["mountPath"] == "/tmp"
    assert all("sizeLimit" in volumes[n]["emptyDir"] for n in ("shm", "home", "tmp"))
    source = kwargs.get("source") or model_source(d.model)
    if isinstance(source, VolumeModel):
        assert volumes["model"]["persistentVolumeClaim"] == {"claimName": source.claim,
                                                             "readOnly": True}
        assert mounts["model"] == {"name": "model", "mountPath": "/models", "readOnly": True}
        assert c["args"][0] == source.mounted
    else:
        assert "model" not in volumes and c["args"][0] == source.repo_id
    # resources: requests = limits; GPUs = TP x PP on the GPU engine alone
    res = c["resources"]
    assert res["requests"] == res["limits"]
    size = d.size or pod_size(d.engine, d.tp * d.pp)
    expected = {"cpu": str(size.cpu), "memory": gib(size.memory_bytes),
                "ephemeral-storage": gib(size.ephemeral_bytes)}
    if d.engine == "gpu":
        expected["nvidia.com/gpu"] = str(d.tp * d.pp)
        assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert res["limits"] == expected
    assert pod.get("nodeSelector") == ({"kubernetes.io/arch": "amd64"} if d.engine == "cpu"
                                       else None)
    secrets = {e["name"] for e in c["env"] if "valueFrom" in e}
    assert secrets == ({"VLLM_API_KEY"} if d.api_key_secret else set()) | (
        {"HF_TOKEN"} if isinstance(source, HubModel) else set())
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_the_memory_counts_the_shared_memory():
    size = PodSize(cpu=4, memory_bytes=20 * GIB, shm_bytes=3 * GIB, home_bytes=10 * GIB)
    deployment, _ = k8s_manifests(plan(size=size))
    pod = deployment["spec"]["template"]["spec"]
    shm = next(v for v in pod["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "3Gi"}
    assert pod["containers"][0]["resources"]["limits"]["memory"] == "20Gi"


@pytest.mark.parametrize("kwargs, lines", [
    (dict(secret="vllm-api-key", source=VolumeModel("vllm-models", "llama")), [
        "image vllm/vllm-openai:v0.32.0",
        'kubectl create secret generic vllm-api-key --from-literal=api-key="$YOUR_KEY"  # '
        "VLLM_API_KEY; clients send it as a Bearer token",
        "PersistentVolumeClaim vllm-models holding the model (folder llama/ inside it), readable "
        "by uid 1000; mounted read-only at /models",
        "per replica (requests = limits): 1 x nvidia.com/gpu, 6 CPU, 11Gi memory (/dev/shm 2Gi "
        "included), 15Gi ephemeral storage: framework/fleet/manifests.py pod_size"]),
    (dict(engine="cpu", source=HubModel("org/m", REV),
          size=PodSize(cpu=16, memory_bytes=13 * GIB, shm_bytes=2 * GIB, home_bytes=12 * GIB)), [
        "image vllm/vllm-openai-cpu:v0.32.0-x86_64",
        f"model org/m at revision {REV} from the Hugging Face hub; for a gated model: kubectl "
        'create secret generic hf-token-secret --from-literal=token="$HF_TOKEN"',
        "per replica (requests = limits): 16 CPU, 13Gi memory (/dev/shm 2Gi included), 17Gi "
        "ephemeral storage: framework/fleet/manifests.py pod_size"]),
])
def test_k8s_notes(kwargs, lines):
    assert k8s_notes(plan(**kwargs)) == lines
