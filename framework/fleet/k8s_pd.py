"""A prefill/decode deployment on Kubernetes (`export --format k8s` of a P/D winner): one
Deployment + Service per role, and the router the sweep measured them behind, as dicts.

- prefill and decode: each role is manifests.k8s_manifests of the deployment renamed
  `<name>-prefill` / `<name>-decode`, its replicas the role's share of the fleet
  (Deployment.roles), every server with the KV connector's `--kv-transfer-config`. A connector
  that keeps the KV in files (ExampleConnector) gets them in a PersistentVolumeClaim every pod
  of both roles mounts at KV_MOUNT (ReadWriteMany: prefill and decode pods run on different
  nodes), the claim `kv_claim`;
- the router: framework/engine/router.py in vLLM's own image (which holds aiohttp and
  prometheus_client, the router's only dependencies), its source files in a ConfigMap mounted
  read-only at ROUTER_MOUNT and put on PYTHONPATH; `--prefill` the prefill Service,
  `--backend` the decode Service (each Service spreads requests over its role's pods); its
  Service is the deployment's entry point, named like the deployment. Same restricted pod
  security as the servers; it takes ROUTER_CPU and ROUTER_MEMORY (no GPU).
Pure: plain dicts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from framework.fleet.manifests import HOME
from framework.fleet.manifests import UID
from framework.fleet.manifests import Deployment
from framework.fleet.manifests import dns_name
from framework.fleet.manifests import image_arch
from framework.fleet.manifests import k8s_manifests

KV_CLAIM = "vllm-kv"
KV_MOUNT = "/kv"
ROUTER_MOUNT = "/opt/vllm-sweep"
ROUTER_CPU = "1"
ROUTER_MEMORY = "1Gi"
_KEY = re.compile(r"[^-._a-zA-Z0-9]")


def _kv_config(d: Deployment) -> tuple[dict[str, object], bool]:
    """The connector's config with its folder (if it has one) at KV_MOUNT; whether it has."""
    config = json.loads(json.dumps(dict(d.kv_transfer or {})))
    extra = config.get("kv_connector_extra_config")
    has_folder = isinstance(extra, dict) and "shared_storage_path" in extra
    if has_folder:
        extra["shared_storage_path"] = KV_MOUNT
    return config, has_folder


def _pod(deployment: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return pod


def role_manifests(d: Deployment, kv_claim: str = KV_CLAIM) -> list[dict[str, object]]:
    """[Deployment, Service] of the prefill role, then of the decode role (module docstring)."""
    config, has_folder = _kv_config(d)
    flag = ["--kv-transfer-config", json.dumps(config, separators=(",", ":"))]
    out: list[dict[str, object]] = []
    for role, replicas in zip(("prefill", "decode"), d.roles):
        served = replace(d, name=f"{dns_name(d.name)}-{role}", replicas=replicas,
                         argv=(*d.argv, *flag))
        deployment, service = k8s_manifests(served)
        if has_folder:
            pod = _pod(deployment)
            pod["containers"][0]["volumeMounts"].append({"name": "kv", "mountPath": KV_MOUNT})
            pod["volumes"].append({"name": "kv", "persistentVolumeClaim": {"claimName": kv_claim}})
        out += [deployment, service]
    return out


def router_manifests(d: Deployment, files: Mapping[str, str]) -> list[dict[str, object]]:
    """[ConfigMap, Deployment, Service] of the router (module docstring); `files`: the router's
    source, path relative to its import root -> text (engine.router.standalone_files)."""
    name = dns_name(d.name)
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": "router",
              "app.kubernetes.io/managed-by": "vllm-sweep"}
    keys = {path: _KEY.sub("_", path) for path in files}
    config_map: dict[str, object] = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": f"{name}-router", "labels": dict(labels)},
        "data": {keys[path]: text for path, text in files.items()},
    }
    port = d.port
    amounts = {"cpu": ROUTER_CPU, "memory": ROUTER_MEMORY}
    container: dict[str, object] = {
        "name": "router",
        "image": d.image,
        "command": ["python3", "-m", "framework.engine.router", "--host", "0.0.0.0",
                    "--port", str(port), "--prefill", f"http://{name}-prefill:{port}",
                    "--backend", f"http://{name}-decode:{port}"],
        "env": [{"name": "PYTHONPATH", "value": ROUTER_MOUNT}, {"name": "HOME", "value": HOME}],
        "ports": [{"name": "http", "containerPort": port}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": port},
                           "periodSeconds": 10, "failureThreshold": 3},
        "resources": {"requests": dict(amounts), "limits": dict(amounts)},
        "securityContext": {"allowPrivilegeEscalation": False, "privileged": False,
                            "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "router", "mountPath": ROUTER_MOUNT, "readOnly": True},
                         {"name": "home", "mountPath": HOME}],
    }
    pod: dict[str, object] = {
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [{"name": "router", "configMap": {
                        "name": f"{name}-router",
                        "items": [{"key": keys[path], "path": path} for path in files]}},
                    {"name": "home", "emptyDir": {"sizeLimit": "1Gi"}}],
    }
    if (arch := image_arch(d.image)) is not None:
        pod["nodeSelector"] = {"kubernetes.io/arch": arch}
    deployment: dict[str, object] = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"replicas": 1, "selector": {"matchLabels": dict(labels)},
                 "template": {"metadata": {"labels": dict(labels)}, "spec": pod}},
    }
    service: dict[str, object] = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"selector": dict(labels), "type": "ClusterIP",
                 "ports": [{"name": "http", "port": port, "targetPort": port}]},
    }
    return [config_map, deployment, service]


def pd_manifests(d: Deployment, files: Mapping[str, str],
                 kv_claim: str = KV_CLAIM) -> list[dict[str, object]]:
    """Everything `kubectl apply` needs for prefill/decode deployment `d`, but its claims and
    secrets: the two roles, then the router."""
    return [*role_manifests(d, kv_claim), *router_manifests(d, files)]


def pd_notes(d: Deployment, kv_claim: str = KV_CLAIM) -> list[str]:
    """What the P/D manifests need beyond a single server's (comment lines)."""
    prefill, decode = d.roles
    lines = [f"prefill/decode: {prefill} prefill + {decode} decode pods behind the router "
             f"(Service {dns_name(d.name)}), as measured"]
    if _kv_config(d)[1]:
        lines.append(f"PersistentVolumeClaim {kv_claim} (ReadWriteMany: pods of both roles "
                     f"mount it at {KV_MOUNT}, writable by uid {UID}): the KV connector's files")
    return lines
