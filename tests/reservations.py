"""GPUs held aside on a Ray cluster, so that a test can leave every node a chosen number free
(#32 defect 3: placement packs a PP = 2 x TP = 1 trial on one node while that node has room, so
a test of PP across nodes must leave no node room for two stages). The holder is a child
process (this process joins no cluster, so an in-process CLI run may): one STRICT_PACK
placement group per GPU node, pinned to it by its `ray.io/node-id` label, until the block ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator

HOLDER = r"""
import json, sys
import ray
from ray.util.placement_group import placement_group

ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
leave = int(sys.argv[2])
groups = []
for node in ray.nodes():
    gpus = node["Resources"].get("GPU", 0)
    if node["Alive"] and gpus > leave:
        groups.append(placement_group([{"GPU": gpus - leave}], strategy="STRICT_PACK",
                                      bundle_label_selector=[{"ray.io/node-id": node["NodeID"]}]))
ray.get([g.ready() for g in groups], timeout=120)
print(json.dumps({"held": len(groups)}), flush=True)
sys.stdin.read()  # held until the test closes our stdin; Ray frees a dead driver's groups
"""


@contextlib.contextmanager
def gpus_held(address: str, leave: int) -> Iterator[int]:
    """All but `leave` GPUs of every node with more than `leave` held while the block runs;
    yields the number of nodes held. Waits for the holder's line, not for time."""
    env = {**os.environ, "RAY_ADDRESS": ""}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, address, str(leave)], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        line = holder.stdout.readline()  # its first line, or "" if it died
        assert line, f"the GPU holder exited {holder.wait(timeout=60)} before holding"
        yield int(json.loads(line)["held"])
    finally:
        if holder.stdin is not None:
            holder.stdin.close()
        try:
            holder.wait(timeout=60)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait(timeout=30)
