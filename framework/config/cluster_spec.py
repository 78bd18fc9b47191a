"""The `cluster:` section of a sweep file: where trials run and what the nodes share."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic import field_validator

from framework.config.spec_base import Spec


class ClusterSpec(Spec):
    """Where trials run. `address: null` (and no RAY_ADDRESS) starts a private local Ray.

    `max_concurrent_trials: null` runs as many trials side by side as the cluster can place,
    except on the CPU engine, where it means 1: CPU trials share the same cores and would
    distort each other's measurements. `start_ahead: n` (CPU and fake engines): up to 1 + n
    trials at once, whose servers start side by side while nothing is measured and then wait,
    ready, for their turn: each measurement still runs alone (trial/share_gate.py).
    `cpus_per_worker`: CPUs of each CPU-engine bundle.
    `num_cpus` / `num_gpus`: resources of the private local Ray (default: what Ray detects;
    `num_gpus` on a machine without GPUs declares fake ones, for the fake engine).
    `cache_dir`: the node-local directory for vLLM's compile cache and Hugging Face's files,
    kept across jobs (default: $VLLM_SWEEP_CACHE_DIR, else `.cache` of the working directory
    on a private local Ray and `~/.cache/vllm-sweep` on a joined cluster; `~` is expanded on
    each node).
    `autoscaling_config`: a `ray up` cluster config (e.g. cluster.yaml) whose worker node types
    the cluster's autoscaler may add: a trial whose shape fits only on such a node waits for it
    instead of being refused as unplaceable (default on a joined cluster: Ray's record of the
    node groups, else the head's ~/ray_bootstrap_config.yaml; framework/cluster/autoscaling.py).
    `shared_folder`: an absolute path every node sees as one folder (a shared file system: NFS,
    a cluster file system), for what the servers of one trial must share across nodes: the KV
    cache of a prefill/decode trial whose connector keeps it in files (ExampleConnector). Each
    such trial makes a private folder in it and removes it at its end. Unset, such a trial runs
    on a one-node cluster only; set, the sweep first checks that every node sees a file the
    driver wrote there (a node-local path is refused).
    """

    address: str | None = None
    shared_folder: str | None = None
    autoscaling_config: Path | None = None
    cache_dir: str | None = None
    num_cpus: int | None = Field(default=None, gt=0)
    num_gpus: int | None = Field(default=None, ge=0)
    cpus_per_worker: int = Field(default=1, gt=0)
    max_concurrent_trials: int | None = Field(default=None, gt=0)
    start_ahead: int = Field(default=0, ge=0)
    retry_node_lost: bool = False  # run a trial whose node died once more, as a new trial

    @field_validator("shared_folder")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"{value!r} is not an absolute path: every node resolves it alike "
                             "only from /")
        return value
