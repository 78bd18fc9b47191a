"""cluster.shared_folder, checked before any trial relies on it: a folder every node must see
as one (a shared file system), where a prefill/decode trial whose KV connector keeps the KV in
files (ExampleConnector) makes its private folder, so that its prefill and decode servers may
run on different nodes.

`check_shared_folder` writes a file of random content in a private folder it makes there on
the driver's node, then reads it back on every alive node, in one Ray task pinned to each
(NodeAffinitySchedulingStrategy, no CPU asked, so a busy node answers too); a node that does
not find it, or finds other content, does not share the folder: a node-local path (each node
its own /tmp/kv, say) fails here, by name, instead of every cross-node trial moving no KV
(`kv_not_transferred`). The private folder is removed afterwards.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from framework.base.errors import ClusterError

CHECK_TIMEOUT_S = 120.0
_MARKER = "vllm-sweep-shared-folder-check"


def _read(path: str) -> str | None:
    """Runs on a node: the file's text, None when the node does not see it."""
    try:
        return Path(path).read_text()
    except OSError:
        return None


_read_remote = ray.remote(num_cpus=0, max_calls=1)(_read)


def check_shared_folder(folder: str, timeout_s: float = CHECK_TIMEOUT_S) -> int:
    """Raise ClusterError (one line: the key, the path, the node that does not see it) unless
    every alive node of the connected Ray cluster reads, at the same path under `folder`, what
    the driver wrote there; returns the number of nodes checked."""
    key = "cluster.shared_folder"
    if not Path(folder).is_dir():
        raise ClusterError(f"{key}: {folder}: no such folder on the driver's node")
    try:
        private = Path(tempfile.mkdtemp(prefix="vsweep-check-", dir=folder))
    except OSError as exc:
        raise ClusterError(f"{key}: {folder}: the driver cannot write there ({exc.strerror})") \
            from None
    try:
        marker = private / _MARKER
        content = secrets.token_hex(16)
        marker.write_text(content)
        private.chmod(0o755)  # readable by the nodes' workers, whatever user they run as
        nodes = [n for n in ray.nodes() if n["Alive"]]
        refs = [_read_remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            n["NodeID"], soft=False)).remote(str(marker)) for n in nodes]
        try:
            seen = ray.get(refs, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise ClusterError(f"{key}: {folder}: not every node answered within "
                               f"{timeout_s:.0f} s") from None
        for node, text in zip(nodes, seen):
            if text != content:
                raise ClusterError(
                    f"{key}: {folder}: node {node['NodeManagerAddress']} does not see the file "
                    f"the driver wrote there ({marker}): not a folder every node shares; name "
                    "a shared file system's path, or run prefill/decode on one node")
        return len(nodes)
    finally:
        shutil.rmtree(private, ignore_errors=True)
