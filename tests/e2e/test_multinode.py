"""Real pipeline parallelism across two emulated Ray nodes (distinct loopback IPs).

The cluster is started by this test and the sweep joins it through `cluster.address`: a head
from ray.cluster_utils that holds no CPU (the GCS, and the raylet of the driver, which runs in
this process), and two isolated nodes (tests/isolated_nodes.py, #32), each in its own mount and
PID namespace with its own TMPDIR, HOME and caches, every process tagged with a marker env var.
vLLM runs in-process in the trial's server actor with the Ray executor and the project's CPU
platform plugin; its two pipeline stages must land in the trial's two bundles, one per node.
Wherever the server actor lands, the other stage's node cannot read a file it wrote (nor the
driver's): a server that hands vLLM's workers a path on its own node fails here, as across real
hosts (vLLM's "File does not exist" for the logging config that eeb7f4a wrote).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.helpers import NO_REMEASURE
from tests.helpers import cli_in_process
from tests.helpers import joined_cli_env
from tests.helpers import marked_processes
from tests.helpers import read_trials
from tests.helpers import vsweep_leftovers
from tests.isolated_nodes import IsolatedCluster
from tests.isolated_nodes import isolated_cluster

pytestmark = pytest.mark.server


@pytest.fixture
def two_node_cluster(short_tmp) -> Iterator[IsolatedCluster]:
    """A head with no CPU and two isolated nodes at 127.0.0.2 and 127.0.0.3 (1 CPU each), all
    under short_tmp. The head stays in this process's namespaces, so it would see the nodes'
    files: it takes no trial work."""
    with isolated_cluster(short_tmp, {"num_cpus": 0}, [{"ip": "127.0.0.2", "num_cpus": 1},
                                                       {"ip": "127.0.0.3", "num_cpus": 1}]) as cluster:
        yield cluster


def write_pp_sweep(tmp: Path, model: Path, address: str) -> Path:
    space = tmp / "pp_space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        "pipeline-parallel-size": {"type": "categorical", "choices": [2], "default": 2},
        "max-num-seqs": {"type": "categorical", "choices": [16], "default": 16},
    }}))
    sweep = tmp / "pp.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "pp", "model": str(model), "search_space": str(space),
        # PP on CPU needs torch.compile: --enforce-eager skips the inter-stage buffers.
        "server": {"args": {"max-model-len": 512}, "host": "node", "startup_timeout_s": 420},
        "workload": {"num_prompts": 24, "input_len": 64, "output_len": 16,
                     "max_concurrency": 4, "warmup_requests": 4},
        "sla": {"p99_ttft_ms": 60000},
        "search": {**NO_REMEASURE, "n_trials": 1, "baseline": False},
        "cluster": {"address": address, "cpus_per_worker": 1},
        "results_dir": str(tmp / "results"),
    }))
    return sweep


@pytest.mark.timeout(900)
def test_pipeline_stages_span_two_nodes(tiny_model, short_tmp, two_node_cluster):
    address, marker = two_node_cluster.address, two_node_cluster.marker
    sweep = write_pp_sweep(short_tmp, tiny_model, address)
    # No VLLM_SWEEP_CACHE_DIR of this machine's (the repository's .cache, which every emulated
    # node would share): the servers' caches take sweep/loader.py cache_dir's default, a path
    # under short_tmp or a node's HOME, private to each node here as on real hosts.
    env = joined_cli_env(marker, short_tmp, short_tmp)
    env.pop("VLLM_SWEEP_CACHE_DIR", None)
    res = cli_in_process("run", str(sweep), cwd=short_tmp, env=env)
    log = (short_tmp / "results/pp/logs/trial-00000.log")
    log_text = log.read_text() if log.exists() else ""
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:] + log_text[-3000:]
    trials = read_trials(short_tmp / "results", "pp")
    row = trials.iloc[0]
    assert row["state"] == "COMPLETE", (row["fail_reason"], row["fail_detail"], log_text[-3000:])
    assert row["completed"] == 24
    placement = list(row["placement"])
    assert len(placement) == 2 and len(set(placement)) == 2, placement
    assert row["node_count"] == 2
    argv = list(row["vllm_argv"])
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"
    assert argv[argv.index("--distributed-executor-backend") + 1] == "ray"
    # vLLM reused the trial's group instead of creating its own, and loaded our plugin.
    assert "existing placement group" in log_text.lower() or "current placement group" in log_text.lower()
    assert "vllm-sweep CPU Ray platform plugin active" in log_text
    # Nothing of the trial is left: no vLLM process among the cluster's processes.
    leftovers = []
    for proc in marked_processes(marker):
        try:
            text = " ".join(proc.cmdline()) + proc.name()
        except Exception:  # noqa: BLE001 - exited meanwhile
            continue
        if "VLLM" in text or "ServerActor" in text or "RayWorker" in text:
            leftovers.append(text[:120])
    assert leftovers == []
    # Nor any of the server's files in either node's TMPDIR.
    for node in two_node_cluster.nodes:
        assert vsweep_leftovers(node.folder) == [], node.ip
    # A joined cluster's servers cache under their node's HOME, not the driver's directory.
    assert not (short_tmp / ".cache").exists()
    assert any((node.folder / ".cache" / "vllm-sweep" / "vllm").is_dir()
               for node in two_node_cluster.nodes)
