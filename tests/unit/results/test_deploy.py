"""`export` and `compare` (#20): the pure deployment builders table-tested, each manifest checked
by its platform's own schema (Kubernetes: kubernetes-validate's bundled OpenAPI schemas, strict;
Ray Serve LLM: its own config classes), and both commands on real stored Parquet rows."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from framework.base.errors import ConfigError
from framework.cluster.serve_llm import check_ray_serve_config
from framework.config.search_space import load_search_space
from framework.config.specs import SweepSpec
from framework.engine.memory_model import read_model_facts
from framework.engine.memory_model import weight_bytes_per_gpu
from framework.fleet.manifests import Deployment
from framework.fleet.manifests import dns_name
from framework.fleet.manifests import k8s_manifests
from framework.fleet.prices import PRICES
from framework.fleet.ray_serve import engine_kwargs
from framework.fleet.ray_serve import ray_serve_app
from framework.results.deploy import node_cpus
from framework.results.deploy import weights_bytes
from framework.results.rows import TrialContext
from framework.results.rows import trial_columns
from framework.results.rows import trial_row
from framework.results.store import ResultStore
from framework.sweep.fleet_inputs import target_of
from framework.trial.objective import Verdict
from framework.trial.run import TrialOutcome
from tests.cli import cli_in_process
from tests.paths import ROOT
from tests.sweeps import T0
from tests.sweeps import killed_sweep_file
from tests.sweeps import write_rows

K8S_VERSION = "1.33.0"

# The stored sweeps' target and the list prices they are costed at (framework.fleet.prices)
TARGET_RPS, HEADROOM = 25.0, 0.2
H100_HOUR = PRICES["H100-80GB"].per_gpu_hour
L4_HOUR = PRICES["L4-24GB"].per_gpu_hour


def fleet(target_rps: float, capacity_rps: float, gpu_hour: float) -> tuple[int, float]:
    """The fleet's formula (framework/fleet/sizing.py), for the one-GPU replicas of vLLM's
    defaults: replicas = ceil(target x (1 + headroom) / capacity), cost per hour = replicas x
    GPUs per replica (TP x PP = 1) x the price of a GPU-hour."""
    replicas = math.ceil(target_rps * (1 + HEADROOM) / capacity_rps)
    return replicas, replicas * 1 * gpu_hour


def per_mtok(gpu_hour: float, tok_s: float) -> float:
    """Cost of a million output tokens on one replica: price / (tok/s x 3600) x 1e6."""
    return gpu_hour / (tok_s * 3600) * 1e6


def plan(engine: str = "cpu", gpu: str | None = None, tp: int = 1, pp: int = 1,
         replicas: int | None = None, flags: dict | None = None) -> Deployment:
    flags = flags if flags is not None else {"enforce-eager": True, "max-num-seqs": 16}
    if tp * pp > 1:
        flags = {**flags, "tensor-parallel-size": tp, "pipeline-parallel-size": pp,
                 "distributed-executor-backend": "ray"}
    return Deployment(name="Llama_8B on H100", model="/models/llama", served_name="llama",
                      flags=flags, argv=("/models/llama", "--max-num-seqs", "16"), engine=engine,
                      gpu=gpu, tp=tp, pp=pp, replicas=replicas, image="vllm/vllm-openai:v0.32.0")


@pytest.mark.parametrize("name, label", [
    ("Llama_8B on H100", "llama-8b-on-h100"),   # lower case, runs of other characters -> "-"
    ("--x--", "x"),                             # no leading / trailing dash
    ("a" * 70, "a" * 63),                       # at most 63
    ("___", "vllm"),                            # nothing left
])
def test_dns_name(name, label):
    assert dns_name(name) == label


@pytest.mark.parametrize("flags, kwargs", [
    ({"max-num-seqs": 16, "enable-prefix-caching": False}, {"max_num_seqs": 16,
                                                            "enable_prefix_caching": False}),
    ({"kv-cache-dtype": None}, {}),                                   # unset: left out
    ({"tensor-parallel-size": 2, "distributed-executor-backend": "ray"},
     {"tensor_parallel_size": 2}),                                    # Ray Serve sets the backend
])
def test_engine_kwargs(flags, kwargs):
    assert engine_kwargs(flags) == kwargs


@pytest.mark.parametrize("engine, gpu, replicas, accel", [
    ("gpu", "H100-80GB", 3, {"accelerator_type": "H100"}),
    ("gpu", "A100-40GB", None, {"accelerator_type": "A100-40G"}),   # no fleet sized: 1 replica
    ("gpu", None, 2, {}),                                            # type unknown: not stated
    ("cpu", None, 2, {"accelerator_config": {"kind": "cpu"}}),
])
def test_ray_serve_app(engine, gpu, replicas, accel):
    doc = ray_serve_app(plan(engine, gpu, replicas=replicas))
    (app,) = doc["applications"]
    assert app["import_path"] == "ray.serve.llm:build_openai_app"
    (llm,) = app["args"]["llm_configs"]
    assert llm["model_loading_config"] == {"model_id": "llama", "model_source": "/models/llama"}
    assert llm["deployment_config"] == {"num_replicas": replicas or 1}
    assert {k: llm[k] for k in ("accelerator_type", "accelerator_config") if k in llm} == accel


@pytest.mark.parametrize("engine, tp, pp, replicas, gpus", [
    ("gpu", 1, 1, 4, "1"),
    ("gpu", 2, 2, 3, "4"),      # limits = TP x PP
    ("cpu", 1, 1, None, None),  # no GPU limit on CPU; no fleet: 1 replica
    ("cpu", 2, 1, 2, None),
])
def test_k8s_manifests_are_valid_kubernetes(engine, tp, pp, replicas, gpus):
    # the builders one by one: tests/unit/fleet/test_k8s_manifests.py
    deployment, service = k8s_manifests(plan(engine, "H100-80GB", tp, pp, replicas))
    for doc in (deployment, service):  # raises kubernetes_validate.ValidationError when not
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert deployment["spec"]["replicas"] == (replicas or 1)
    pod = deployment["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["vllm", "serve"]
    # the model folder on the default claim, served under the name clients sent the sweep
    assert c["args"] == ["/models/llama", "--max-num-seqs", "16", "--served-model-name", "llama",
                         "--port", "8000"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    assert c["resources"]["limits"].get("nvidia.com/gpu") == gpus
    assert {v["name"] for v in pod["volumes"]} == {"shm", "home", "tmp", "model"}
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_a_data_parallel_pod_holds_every_engines_gpus():
    d = replace(plan("gpu", "H100-80GB", tp=2, replicas=3,
                     flags={"data-parallel-size": 2, "tensor-parallel-size": 2}), dp=2)
    deployment, _ = k8s_manifests(d)
    kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "4"  # TP 2 x DP 2 in one pod
    assert deployment["spec"]["replicas"] == 3


@pytest.mark.parametrize("engine, connector, folder", [
    ("cpu", "ExampleConnector", "/mnt/shared/vllm-kv"), ("gpu", "NixlConnector", None)])
def test_a_prefill_decode_deployment_on_kubernetes(engine, connector, folder):
    """Guards #36's k8s export of a P/D winner: a Deployment + Service per role (replicas the
    fleet's split: 2 groups of 1 P + 2 D), every server with the connector's flag (its folder
    the KV claim's mount, which both roles mount, for a connector that keeps files), and the
    router in vLLM's image from a ConfigMap of its source, in front of the two Services; all of
    it valid Kubernetes."""
    from framework.engine.kv_transfer import kv_transfer_config
    from framework.engine.router_source import ROUTER_FILES
    from framework.engine.router_source import standalone_files
    from framework.fleet.k8s_pd import KV_MOUNT
    from framework.fleet.k8s_pd import pd_manifests

    kv = json.loads(kv_transfer_config(connector, folder))
    d = replace(plan(engine, "H100-80GB" if engine == "gpu" else None, replicas=6), servers=3,
                prefill=1, kv_transfer=kv)
    docs = pd_manifests(d, standalone_files())
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert [(doc["kind"], doc["metadata"]["name"]) for doc in docs] == [
        ("Deployment", "llama-8b-on-h100-prefill"), ("Service", "llama-8b-on-h100-prefill"),
        ("Deployment", "llama-8b-on-h100-decode"), ("Service", "llama-8b-on-h100-decode"),
        ("ConfigMap", "llama-8b-on-h100-router"), ("Deployment", "llama-8b-on-h100"),
        ("Service", "llama-8b-on-h100")]
    prefill, _, decode, _, config_map, router, _ = docs
    assert [prefill["spec"]["replicas"], decode["spec"]["replicas"]] == [2, 4]
    for role in (prefill, decode):
        pod = role["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        sent = json.loads(c["args"][c["args"].index("--kv-transfer-config") + 1])
        assert sent["kv_connector"] == connector
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert (KV_MOUNT in mounts) == (folder is not None)
        if folder is not None:
            assert sent["kv_connector_extra_config"]["shared_storage_path"] == KV_MOUNT
    (c,) = router["spec"]["template"]["spec"]["containers"]
    assert c["command"][:3] == ["python3", "-m", "framework.engine.router"]
    assert c["command"][c["command"].index("--prefill") + 1] == "http://llama-8b-on-h100-prefill:8000"
    assert c["command"][c["command"].index("--backend") + 1] == "http://llama-8b-on-h100-decode:8000"
    items = router["spec"]["template"]["spec"]["volumes"][0]["configMap"]["items"]
    assert sorted(i["path"] for i in items) == sorted(ROUTER_FILES)
    assert set(config_map["data"]) == {i["key"] for i in items}


def test_a_broken_k8s_manifest_is_caught_by_the_schema():
    deployment, _ = k8s_manifests(plan("gpu", "H100-80GB"))
    deployment["spec"]["replicas"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


@pytest.mark.parametrize("engine, gpu, tp", [("cpu", None, 1), ("gpu", "H100-80GB", 2),
                                             ("gpu", "L4-24GB", 1)])
def test_ray_serve_llm_accepts_the_config(engine, gpu, tp):
    assert check_ray_serve_config(ray_serve_app(plan(engine, gpu, tp, replicas=2))) == 1


@pytest.mark.parametrize("engine, gpu", [("cpu", None), ("gpu", "H100-80GB")])
def test_a_data_parallel_deployment_is_ray_serve_llms_dp_app(engine, gpu):
    d = replace(plan(engine, gpu, replicas=3, flags={"data-parallel-size": 2}), dp=2)
    doc = ray_serve_app(d)
    app = doc["applications"][0]
    assert app["import_path"] == "ray.serve.llm:build_dp_openai_app"
    assert app["args"]["llm_config"]["engine_kwargs"]["data_parallel_size"] == 2
    assert check_ray_serve_config(doc) == 1
    assert d.devices == 2
    import ray

    assert not ray.is_initialized()  # the check starts no Ray (DPServer's options would)


@pytest.mark.parametrize("engine, gpu, connector", [("cpu", None, "ExampleConnector"),
                                                     ("gpu", "H100-80GB", "NixlConnector")])
def test_a_prefill_decode_deployment_is_ray_serve_llms_pd_app(engine, gpu, connector):
    """Guards #36's Ray Serve export of 1P1D: build_pd_openai_app with a prefill and a decode
    config, each with the KV connector, checked by Ray's PDServingArgs; a fleet sized in
    groups of 3 servers (1 P + 2 D) x 2 groups splits 2 P / 4 D."""
    from framework.engine.kv_transfer import kv_transfer_config

    folder = "/mnt/kv" if connector == "ExampleConnector" else None
    kv = json.loads(kv_transfer_config(connector, folder))
    d = replace(plan(engine, gpu, replicas=6), servers=3, prefill=1, kv_transfer=kv)
    doc = ray_serve_app(d)
    app = doc["applications"][0]
    assert app["import_path"] == "ray.serve.llm:build_pd_openai_app"
    prefill, decode = app["args"]["prefill_config"], app["args"]["decode_config"]
    assert prefill["deployment_config"]["num_replicas"] == 2
    assert decode["deployment_config"]["num_replicas"] == 4
    for side in (prefill, decode):
        assert side["engine_kwargs"]["kv_transfer_config"]["kv_connector"] == connector
    assert check_ray_serve_config(doc) == 2
    del decode["engine_kwargs"]["kv_transfer_config"]  # Ray's own rule: both sides need one
    with pytest.raises(ConfigError, match="kv_transfer_config is required"):
        check_ray_serve_config(doc)


def test_a_broken_data_parallel_app_is_caught():
    doc = ray_serve_app(replace(plan("cpu", flags={"data-parallel-size": 2}), dp=2))
    doc["applications"][0]["args"]["llm_config"]["engine_kwargs"]["data_parallel_size"] = 0
    with pytest.raises(ConfigError, match="data_parallel_size"):
        check_ray_serve_config(doc)


@pytest.mark.parametrize("change, reason", [
    (lambda llm: llm["engine_kwargs"].update(max_num_seqz=4), "Unknown engine argument"),
    (lambda llm: llm.update(accelerator_type="H1000"), "Unsupported accelerator type"),
    (lambda llm: llm["deployment_config"].update(num_replicas=-1), "Invalid deployment config"),
])
def test_ray_serve_llm_rejects_a_broken_config(change, reason):
    doc = ray_serve_app(plan("gpu", "H100-80GB"))
    change(doc["applications"][0]["args"]["llm_configs"][0])
    with pytest.raises(ConfigError, match=reason):
        check_ray_serve_config(doc)


# --- the commands on stored rows -------------------------------------------------------------

def capacity_sweep(tmp: Path, tiny_model: Path, name: str, gpu: str | None,
                   capacities: list[float], tok_s: float, workload_digest: str = "w" * 64,
                   target: float | None = TARGET_RPS, server: dict | None = None) -> Path:
    """A stored sweep in capacity mode, on `gpu` (None: the CPU engine, on a 16-core node):
    trial 0 the defaults, then one trial per further capacity; one server each (no noise
    measured), so the defaults ship."""
    space = load_search_space(ROOT / "search_spaces" / "tiny_cpu.yaml")
    columns = trial_columns(space, (50, 99))
    store = ResultStore(tmp / "results", name)
    for number, capacity in enumerate(capacities):
        params = {} if number == 0 else {"max-num-seqs": 8 * number}
        outcome = TrialOutcome(started_at=T0, argv=("--x",), trial_s=40.0,
                               metrics={"completed": 10, "failed": 0, "capacity_rps": capacity,
                                        "output_throughput": tok_s * (1 + number)})
        ctx = TrialContext(number=number, params=params, is_baseline=number == 0,
                           serve_command=f"vllm serve m --trial {number}", vllm_version="0.32.0",
                           server_log="", provenance={
                               "hardware": f"gpu: 8 x {gpu}" if gpu else "cpu: Test CPU x 16",
                               "model_config_sha256": "m" * 64,
                               "workload_sha256": workload_digest})
        store.write_trial(trial_row(ctx, outcome, Verdict(capacity, True, {}, ()), columns), columns)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name, "model": str(tiny_model),
        **({"engine": "gpu", "gpu": gpu} if gpu else {"engine": "cpu"}),
        **({"server": server} if server else {}),
        "search_space": str(ROOT / "search_spaces" / "tiny_cpu.yaml"),
        "workload": {"percentiles": [50, 99]}, "search": {"n_trials": 10},
        "sla": {"p99_ttft_ms": 500},
        "capacity": {"start_rate": 1.0},
        **({"target": {"request_rate": target, "headroom": HEADROOM}} if target else {}),
        "results_dir": str(tmp / "results")}))
    return path


def test_compare_picks_the_cheapest_fleet(tmp_path, tiny_model):
    # Both ship vLLM's defaults (trial 0: one server each, the noise is unknown). Target 25 req/s,
    # headroom 0.2 -> 30 req/s to carry; list prices (framework.fleet.prices):
    #   H100: capacity 10 req/s -> ceil(30 / 10)  = 3 replicas x 3.9492 = 11.85 USD/hour
    #   L4:   capacity 2.5 req/s -> ceil(30 / 2.5) = 12 replicas x 0.7992 = 9.59 USD/hour: cheapest
    # per million output tokens: H100 3.9492 / (1000 x 3600) x 1e6 = 1.10; L4 0.7992 / (250 x
    # 3600) x 1e6 = 0.89
    h100 = capacity_sweep(tmp_path, tiny_model, "h100", "H100-80GB", [10.0, 12.0], 1000.0)
    l4 = capacity_sweep(tmp_path, tiny_model, "l4", "L4-24GB", [2.5, 2.0], 250.0)
    h100_n, h100_cost = fleet(TARGET_RPS, 10.0, H100_HOUR)
    l4_n, l4_cost = fleet(TARGET_RPS, 2.5, L4_HOUR)
    assert l4_cost < h100_cost  # the premise: more, cheaper GPUs win at this target
    res = cli_in_process("compare", str(h100), str(l4))
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "h100 (gpu H100-80GB; gpu: 8 x H100-80GB): ships vLLM's defaults" in out
    assert f"{h100_n} replicas x 1 = {h100_n} devices, {h100_cost:.2f} USD/hour" in out
    assert f"{l4_n} replicas x 1 = {l4_n} devices, {l4_cost:.2f} USD/hour" in out
    assert f"per million output tokens {per_mtok(H100_HOUR, 1000.0):.2f} USD" in out
    assert f"per million output tokens {per_mtok(L4_HOUR, 250.0):.2f} USD" in out
    assert out.strip().splitlines()[-1].startswith(
        f"cheapest: l4 (gpu L4-24GB): {l4_cost:.2f} USD/hour, {l4_n} replicas")
    # --target 5: 6 req/s -> H100 ceil(6 / 10) = 1 replica (3.95/hour), L4 ceil(6 / 2.5) = 3
    # (3 x 0.7992 = 2.40/hour): L4 still
    h100_n, h100_cost = fleet(5.0, 10.0, H100_HOUR)
    l4_n, l4_cost = fleet(5.0, 2.5, L4_HOUR)
    assert l4_cost < h100_cost
    res = cli_in_process("compare", str(h100), str(l4), "--target", "5")
    assert (f"fleet for 5 req/s (headroom 20%): {h100_n} replicas x 1 = {h100_n} devices, "
            f"{h100_cost:.2f} USD/hour") in res.stdout
    assert f"cheapest: l4 (gpu L4-24GB): {l4_cost:.2f} USD/hour, {l4_n} replicas" in res.stdout


def test_without_a_target_compare_picks_the_cheapest_million_tokens(tmp_path, tiny_model):
    # H100 3.9492 / (1000 tok/s x 3600) x 1e6 = 1.10 USD; L4 0.7992 / (250 x 3600) x 1e6 = 0.89
    h100 = capacity_sweep(tmp_path, tiny_model, "h100", "H100-80GB", [10.0, 12.0], 1000.0, target=None)
    l4 = capacity_sweep(tmp_path, tiny_model, "l4", "L4-24GB", [2.5, 2.0], 250.0, target=None)
    assert per_mtok(L4_HOUR, 250.0) < per_mtok(H100_HOUR, 1000.0)
    res = cli_in_process("compare", str(h100), str(l4))
    assert res.returncode == 0 and "fleet for" not in res.stdout
    assert res.stdout.strip().splitlines()[-1] == (
        f"cheapest: l4 (gpu L4-24GB): {per_mtok(L4_HOUR, 250.0):.2f} USD per million output "
        "tokens; by cost per million output tokens of one replica (no target)")


def test_compare_refuses_sweeps_of_different_workloads(tmp_path, tiny_model):
    a = capacity_sweep(tmp_path, tiny_model, "a", "H100-80GB", [10.0], 1000.0)
    b = capacity_sweep(tmp_path, tiny_model, "b", "L4-24GB", [2.5], 250.0, workload_digest="v" * 64)
    res = cli_in_process("compare", str(a), str(b))
    assert res.returncode == 2 and res.stdout == ""
    (line,) = res.stderr.splitlines()
    assert "different workload digest (a: wwwwwwwwwwww, b: vvvvvvvvvvvv)" in line
    res = cli_in_process("compare", str(a), str(b), "--allow-different")
    assert res.returncode == 0 and "warning: different workload digest" in res.stderr


def test_export_json_carries_the_fleet(tmp_path, tiny_model):
    sweep = capacity_sweep(tmp_path, tiny_model, "h100", "H100-80GB", [10.0, 12.0], 1000.0)
    out = tmp_path / "best.json"
    res = cli_in_process("export", str(sweep), "--format", "json", "-o", str(out))
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    assert doc["trial"] == 0 and doc["verdict"] == "not_distinguishable"
    assert doc["objective"] == {"metric": "capacity_rps", "value": pytest.approx(10.0),
                                "ci95": None, "servers": 1}
    # ceil(25 x 1.2 / 10) = 3 replicas x 1 GPU x 3.9492 USD per H100-hour = 11.8476 USD/hour
    replicas, cost = fleet(TARGET_RPS, 10.0, H100_HOUR)
    assert doc["fleet"]["replicas"] == replicas
    assert doc["fleet"]["cost_per_hour"] == pytest.approx(cost)
    assert doc["serve_argv"][:3] == ["vllm", "serve", str(tiny_model)]


def test_export_of_a_data_parallel_sweep_counts_every_engine(tmp_path, tiny_model):
    # a CPU sweep whose servers all run data-parallel-size 2 (fixed): the defaults ship; the
    # fleet's replica is one DP server of 2 workers, ceil(25 x 1.2 / 10) = 3 of them
    sweep = capacity_sweep(tmp_path, tiny_model, "dp", None, [10.0, 12.0], 1000.0,
                           server={"args": {"data-parallel-size": 2}})
    res = cli_in_process("export", str(sweep), "--format", "json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["data_parallel_size"] == 2 and doc["flags"]["data-parallel-size"] == 2
    replicas, _ = fleet(TARGET_RPS, 10.0, H100_HOUR)
    assert doc["fleet"]["gpus_per_replica"] == 2
    assert doc["fleet"]["replicas"] == replicas and doc["fleet"]["gpus"] == 2 * replicas
    serve = cli_in_process("export", str(sweep), "--format", "ray-serve")
    assert serve.returncode == 0, serve.stderr
    assert "ray.serve.llm:build_dp_openai_app" in serve.stdout



# --- export --format k8s on stored rows (#33 item 8) ---------------------------------------------

def k8s_export(sweep: Path, *args: str) -> tuple[str, dict, dict]:
    """The file's text, its Deployment's pod spec and its container, each manifest validated."""
    res = cli_in_process("export", str(sweep), "--format", "k8s", *args)
    assert res.returncode == 0, res.stderr
    deployment, service = yaml.safe_load_all(res.stdout)
    for doc in (deployment, service):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    pod = deployment["spec"]["template"]["spec"]
    return res.stdout, pod, pod["containers"][0]


def env_of(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def weights_of(model: Path) -> int:
    return sum(f.stat().st_size for f in model.glob("*.safetensors"))


def test_export_k8s_of_a_gpu_sweep(tmp_path, tiny_model):
    sweep = capacity_sweep(tmp_path, tiny_model, "h100", "H100-80GB", [10.0, 12.0], 1000.0)
    text, pod, c = k8s_export(sweep)
    assert text.startswith("# vllm-sweep export h100: trial 0 (")
    assert "# PersistentVolumeClaim vllm-models holding the model (folder tiny-llama/" in text
    assert c["image"] == "vllm/vllm-openai:v0.32.0"  # the rows' vLLM, pinned
    # a local model: the default claim, read-only, the folder inside it, served under its name
    assert c["args"][:1] == ["/models/tiny-llama"]
    assert c["args"][-4:] == ["--served-model-name", "tiny-llama", "--port", "8000"]
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "vllm-models",
                                                       "readOnly": True}} in pod["volumes"]
    env = env_of(c)
    assert "VLLM_API_KEY" not in env and "HF_TOKEN" not in env  # the sweep ran without a key
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_NO_USAGE_STATS"] == "1"
    # 1 GPU: 2 x (2 + 1) vCPUs; memory = weights + 3 GiB x 3 processes + 2 GiB of /dev/shm
    memory = math.ceil((weights_of(tiny_model) + 11 * 2**30) / 2**30)
    assert c["resources"]["limits"] == c["resources"]["requests"] == {
        "cpu": "6", "memory": f"{memory}Gi", "ephemeral-storage": "15Gi", "nvidia.com/gpu": "1"}
    replicas, _ = fleet(TARGET_RPS, 10.0, H100_HOUR)
    assert yaml.safe_load_all(text).__next__()["spec"]["replicas"] == replicas


def test_export_k8s_of_a_cpu_sweep(tmp_path, tiny_model):
    sweep = capacity_sweep(tmp_path, tiny_model, "cpu", None, [2.0, 1.5], 100.0, target=None,
                           server={"env": {"OMP_PROC_BIND": "close"}})
    _, pod, c = k8s_export(sweep)
    assert c["image"] == "vllm/vllm-openai-cpu:v0.32.0-x86_64"  # vLLM's CPU image, not CUDA's
    assert pod["nodeSelector"] == {"kubernetes.io/arch": "amd64"} and "tolerations" not in pod
    env = env_of(c)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["OMP_PROC_BIND"] == "close"
    # the node's 16 cores; memory = weights + 1 GiB of KV cache + 3 x 3 GiB + 2 GiB of /dev/shm
    memory = math.ceil((weights_of(tiny_model) + 12 * 2**30) / 2**30)
    assert c["resources"]["limits"] == {"cpu": "16", "memory": f"{memory}Gi",
                                        "ephemeral-storage": "15Gi"}


def test_export_k8s_api_key_by_reference(tmp_path, tiny_model, monkeypatch):
    monkeypatch.setenv("SWEEP_KEY", "planted-key-value-1234")
    sweep = capacity_sweep(tmp_path, tiny_model, "h100", "H100-80GB", [10.0], 1000.0,
                           server={"api_key_env": "SWEEP_KEY"})
    text, _, c = k8s_export(sweep)
    assert env_of(c)["VLLM_API_KEY"] == {"secretKeyRef": {"name": "vllm-api-key",
                                                          "key": "api-key"}}
    assert "kubectl create secret generic vllm-api-key" in text
    assert "planted-key-value-1234" not in text
    _, _, c = k8s_export(sweep, "--api-key-secret", "team.key")
    assert env_of(c)["VLLM_API_KEY"]["secretKeyRef"]["name"] == "team.key"
    # a sweep without a key gets one when a Secret is named
    plain = capacity_sweep(tmp_path, tiny_model, "plain", "H100-80GB", [10.0], 1000.0)
    _, _, c = k8s_export(plain, "--api-key-secret", "vllm-api-key")
    assert "VLLM_API_KEY" in env_of(c)


def test_export_k8s_model_sources(tmp_path, tiny_model):
    sweep = capacity_sweep(tmp_path, tiny_model, "h100", "H100-80GB", [10.0], 1000.0)
    text, pod, c = k8s_export(sweep, "--model-id", "meta-llama/Llama-3.2-1B",
                              "--hf-token-secret", "hf")
    assert c["args"][0] == "meta-llama/Llama-3.2-1B" and "--served-model-name" not in c["args"]
    env = env_of(c)
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "token", "optional": True}}
    assert "HF_HUB_OFFLINE" not in env and "model" not in {v["name"] for v in pod["volumes"]}
    home = next(v for v in pod["volumes"] if v["name"] == "home")  # the download lands in HOME
    assert home["emptyDir"]["sizeLimit"] == f"{math.ceil(10 + weights_of(tiny_model) / 2**30)}Gi"
    assert "from the Hugging Face hub" in text
    _, pod, c = k8s_export(sweep, "--model-volume", "weights:team/tiny")
    assert c["args"][0] == "/models/team/tiny"
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "weights",
                                                       "readOnly": True}} in pod["volumes"]


def test_export_k8s_from_a_results_directory(tmp_path, tiny_model, monkeypatch):
    # A sweep whose model path is relative, exported through its results directory from
    # elsewhere: the model is read where the sweep ran (origin.json), its weights counted.
    (tmp_path / "models").symlink_to(tiny_model.parent)
    sweep = capacity_sweep(tmp_path, tiny_model, "h100", "H100-80GB", [10.0], 1000.0)
    sweep.write_text(sweep.read_text().replace(str(tiny_model), f"models/{tiny_model.name}"))
    monkeypatch.chdir(tmp_path)
    ResultStore(tmp_path / "results", "h100").write_origin(sweep)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    _, _, c = k8s_export(tmp_path / "results" / "h100")
    assert c["args"][0] == f"/models/{tiny_model.name}"
    memory = math.ceil((weights_of(tiny_model) + 11 * 2**30) / 2**30)
    assert c["resources"]["limits"]["memory"] == f"{memory}Gi"


@pytest.mark.parametrize("args, message", [
    (["--image", "vllm/vllm-openai:latest"], "--image: 'vllm/vllm-openai:latest': :latest is not pinned"),
    (["--image", "vllm/vllm-openai"], "no tag: it means :latest"),
    (["--model-volume", "Bad_Claim"], "--model-volume: 'Bad_Claim': a Kubernetes object name"),
    (["--model-volume", "c:../up"], "relative, without '..'"),
    (["--model-id", "a/b", "--model-volume", "c"], "not both"),
    (["--model-id", "not a repo"], "a Hugging Face hub id"),
    (["--api-key-secret", "Key"], "--api-key-secret: 'Key': a Kubernetes object name"),
])
def test_export_k8s_refuses(tmp_path, tiny_model, args, message):
    sweep = capacity_sweep(tmp_path, tiny_model, "h100", "H100-80GB", [10.0], 1000.0)
    res = cli_in_process("export", str(sweep), "--format", "k8s", *args)
    assert res.returncode == 2 and res.stdout == ""
    assert message in res.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("hardware, cores", [
    ("cpu: Intel(R) Xeon(R) Platinum 8488C x 16", 16),
    ("cpu: AMD EPYC 9R14 96-Core Processor x 192", 192),
    ("cpu: unknown CPU x 0", None),
    ("gpu: 8 x H100", None),
    (None, None),
])
def test_node_cpus(hardware, cores):
    assert node_cpus(hardware) == cores


def test_weights_bytes(tmp_path, tiny_model):
    assert weights_bytes(tiny_model) == weights_of(tiny_model)  # the checkpoint files
    config_only = tmp_path / "m"
    config_only.mkdir()
    (config_only / "config.json").write_text((tiny_model / "config.json").read_text())
    facts = read_model_facts(config_only)
    assert weights_bytes(config_only) == int(weight_bytes_per_gpu(facts, 1, 1))  # estimated
    assert weights_bytes(tmp_path / "absent") is None


def test_export_ships_what_best_ships(tmp_path, tiny_model):
    write_rows(tmp_path / "results")
    sweep = str(killed_sweep_file(tmp_path, tiny_model))
    res = cli_in_process("export", sweep, "--format", "json", "-o", str(tmp_path / "no" / "x.json"))
    assert res.returncode == 2 and "-o: " in res.stderr and "No such file or directory" in res.stderr
    best = yaml.safe_load(cli_in_process("best", sweep, "--format", "yaml").stdout)
    res = cli_in_process("export", sweep, "--format", "serve")
    assert res.returncode == 0 and res.stdout == best["command"] + "\n"
    doc = json.loads(cli_in_process("export", sweep, "--format", "json").stdout)
    assert doc["trial"] == best["trial"] == 0 and doc["flags"] == best["flags"]
    assert "fleet" not in doc  # no target: no fleet


@pytest.mark.parametrize("args, code, message", [
    (["--format", "helm"], 2, "--format: 'helm': expected one of serve, json, ray-serve, k8s"),
    (["--format", "k8s"], 1, "no results for sweep killed in"),
])
def test_export_bad_input_and_nothing_to_export(tmp_path, tiny_model, args, code, message):
    res = cli_in_process("export", str(killed_sweep_file(tmp_path, tiny_model)), *args)
    assert res.returncode == code and res.stdout == ""
    (line,) = res.stderr.splitlines()
    assert message in line


def test_target_from_trace_is_the_traces_mean_rate():
    spec = SweepSpec.model_validate({
        "name": "t", "model": str(ROOT / "models" / "tiny-llama"), "search_space": "s.yaml",
        "workload": {"dataset": "timed_trace", "timed_trace": {"sec_multiplier": 0.001},
                     "dataset_path": str(ROOT / "datasets" / "mooncake_sample.jsonl")},
        "target": {"from_trace": True}})
    # the file's requests over the span of its timestamps (ms, x 0.001 to s): 150 requests,
    # 56 ms .. 33447 ms when written: 150 / 33.391 s = 4.492 req/s
    stamps = [json.loads(line)["timestamp"] * 0.001
              for line in (ROOT / "datasets" / "mooncake_sample.jsonl").read_text().splitlines()]
    assert target_of(Path("s.yaml"), spec).rps == pytest.approx(len(stamps) / (max(stamps) - min(stamps)))


def test_compare_takes_results_directories(tmp_path, tiny_model, monkeypatch):
    # The same two sweeps as above, named by their results directories: each one's origin.json
    # leads back to its sweep file, whose relative results_dir is read from where it ran.
    h100 = capacity_sweep(tmp_path, tiny_model, "h100", "H100-80GB", [10.0, 12.0], 1000.0)
    l4 = capacity_sweep(tmp_path, tiny_model, "l4", "L4-24GB", [2.5, 2.0], 250.0)
    monkeypatch.chdir(tmp_path)
    for sweep in (h100, l4):
        sweep.write_text(sweep.read_text().replace(str(tmp_path / "results"), "results"))
        ResultStore(Path("results"), sweep.stem).write_origin(sweep)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    res = cli_in_process("compare", "../results/h100", "../results/l4", cwd=elsewhere)
    assert res.returncode == 0, res.stderr
    l4_n, l4_cost = fleet(TARGET_RPS, 2.5, L4_HOUR)
    assert res.stdout.strip().splitlines()[-1].startswith(
        f"cheapest: l4 (gpu L4-24GB): {l4_cost:.2f} USD/hour, {l4_n} replicas")
    (tmp_path / "results" / "l4" / "origin.json").unlink()
    res = cli_in_process("compare", "../results/h100", "../results/l4", cwd=elsewhere)
    assert res.returncode == 2 and "no origin.json here" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_export_serve_prints_a_command_per_server_and_the_router(tmp_path, tiny_model):
    """Guards #36's serve export: one server ships its one `vllm serve` line; N replicas a line
    per server on its own port and the router in front with every one as a backend; 1P1D the
    prefill server as the router's --prefill, both with the KV connector's flag."""
    import shlex

    from framework.results import deploy
    from framework.sweep.loader import load

    sweep = capacity_sweep(tmp_path, tiny_model, "serve", None, [10.0], 1000.0)
    sw = load(sweep)
    found = deploy.shipped(sw.store.read_trials(), sw.spec, list(sw.space.parameters))
    assert isinstance(found, deploy.Shipped)
    assert deploy.serve_text(found) == found.serve_command + "\n"

    lines = deploy.serve_text(replace(found, servers=2)).splitlines()
    assert lines[0].startswith("# 2 replicas")
    servers = [shlex.split(line) for line in lines[1:3]]
    assert [argv[argv.index("--port") + 1] for argv in servers] == ["8001", "8002"]
    router = shlex.split(lines[3])
    assert router[:3] == ["python", "-m", "framework.engine.router"]
    assert [router[i + 1] for i, a in enumerate(router) if a == "--backend"] == [
        "http://127.0.0.1:8001", "http://127.0.0.1:8002"]

    lines = deploy.serve_text(replace(found, servers=2, prefill=1)).splitlines()
    assert "1 prefill + 1 decode" in lines[0] and deploy.KV_FOLDER in lines[0]
    for line in lines[1:3]:
        argv = shlex.split(line)
        config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
        assert config["kv_connector_extra_config"]["shared_storage_path"] == deploy.KV_FOLDER
    router = shlex.split(lines[3])
    assert router[router.index("--prefill") + 1] == "http://127.0.0.1:8001"
    assert router[router.index("--backend") + 1] == "http://127.0.0.1:8002"
    # the same deployment for Ray Serve LLM: its P/D app, the same connector and folder
    doc = ray_serve_app(deploy.deployment(replace(found, servers=2, prefill=1), image=""))
    args = doc["applications"][0]["args"]
    assert args["decode_config"]["engine_kwargs"]["kv_transfer_config"] == config
    assert check_ray_serve_config(doc) == 2
