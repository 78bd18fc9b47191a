"""The contract of tests/isolated_nodes.py (#32): an isolated node sees neither the head's files
nor its processes, as another host would not; the host reads what the node leaves in its TMPDIR.

One emulated head (1 CPU) and one isolated node (1 CPU); Ray tasks pinned to each node, run by a
child driver (this process joins no cluster)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.isolated_nodes import isolated_cluster

pytestmark = pytest.mark.server

HEAD = "127.0.0.9"
NODE = "127.0.0.2"

# Pinned to the head: write a file in the task's TMPDIR. Pinned to each node: where its TMPDIR
# and HOME are, whether it sees the head's file, and the raylets in its process table.
PROBE = """
import json, os, sys, tempfile
import psutil, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as On

ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
node_of = {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}

@ray.remote(num_cpus=0)
def write(name):
    path = os.path.join(tempfile.gettempdir(), name)
    with open(path, "w") as f:
        f.write(name)
    return path

@ray.remote(num_cpus=0)
def look(paths):
    raylets = []  # the node address each raylet in this process table serves
    for p in psutil.process_iter():
        try:
            if p.name() == "raylet":
                raylets += [a.split("=", 1)[1] for a in p.cmdline()
                            if a.startswith("--node_ip_address=")]
        except psutil.Error:
            pass
    return {"tmp": tempfile.gettempdir(), "home": os.path.expanduser("~"),
            "sees": {p: os.path.exists(p) for p in paths}, "raylets": raylets}

head, node = sys.argv[2], sys.argv[3]
head_file = ray.get(write.options(scheduling_strategy=On(node_of[head], soft=False)).remote("from-head"))
node_file = ray.get(write.options(scheduling_strategy=On(node_of[node], soft=False)).remote("from-node"))
views = {ip: ray.get(look.options(scheduling_strategy=On(node_of[ip], soft=False)).remote(
    [head_file, node_file])) for ip in (head, node)}
print(json.dumps({"head_file": head_file, "node_file": node_file, "views": views}))
"""


@pytest.mark.timeout(300)
def test_isolated_node_sees_neither_the_heads_files_nor_its_processes(short_tmp):
    with isolated_cluster(short_tmp, {"num_cpus": 1, "node_ip_address": HEAD},
                          [{"ip": NODE, "num_cpus": 1}]) as cluster:
        (node,) = cluster.nodes
        res = subprocess.run([sys.executable, "-c", PROBE, cluster.address, HEAD, NODE],
                             capture_output=True, text=True, timeout=180,
                             env=dict(os.environ, RAY_ADDRESS=""))
        assert res.returncode == 0, res.stderr[-3000:] + node.log_tail()
        seen = json.loads(res.stdout.strip().splitlines()[-1])
        head_file, node_file = seen["head_file"], seen["node_file"]
        on_head, on_node = seen["views"][HEAD], seen["views"][NODE]

        # Each node's TMPDIR is its own folder under short_tmp; the node's HOME is its folder.
        assert on_head["tmp"] == str(short_tmp / "head")
        assert on_node["tmp"] == on_node["home"] == str(node.folder)
        # The head's file is not on the isolated node, nor is anything else of short_tmp.
        assert on_head["sees"][head_file] is True
        assert on_node["sees"] == {head_file: False, node_file: True}
        # The host reads the node's TMPDIR (the leftovers checks): the node's file is there.
        assert (node.folder / "from-node").read_text() == "from-node"
        # The node's process table holds its own raylet only; the head's shows the head's.
        assert on_node["raylets"] == [NODE]
        assert {HEAD, NODE} <= set(on_head["raylets"]), on_head["raylets"]
