"""Run folders (framework/engine/run_folder.py) removed on every node: this run's at its end
(`remove_runs`), and those a killed run left, by the next run (`clean_stale`, and again at
that run's end: RayLauncher.close).

A run's folder on a node is removed at its end by the launcher (every node it started a server
or zygote on; a private Ray's own folder, RAY_DIR, by RaySession once Ray is down). A driver
killed with `kill -9` removes nothing, so each `run` starts by cleaning every alive node: there,
a task ends the processes that still carry the dead driver's session, if the driver's sweep
recorded one (driver_session, `stale_session`), and removes that run's folder; then this user's
other run folders whose run is not known alive and that have not changed for
run_folder.IDLE_S (run_folder.stale). A run is known alive when it is this one, when a live Ray
job of the cluster carries its session id (a driver records it in its job's metadata,
RaySession), or when a live process of this user on the node carries it (SESSION_VAR: a
private Ray's processes do for their whole run). The idle time covers what neither can see: a
live run of another Ray cluster, between two of its servers on this node. Only folders that
pass run_folder.verify (ours, 0700, not a symlink) are touched; another user's never are.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Collection
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import ray
from ray.core.generated import gcs_pb2
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from framework.cluster.driver_session import reap_session
from framework.engine import run_folder
from framework.engine.run_folder import SESSION_VAR

CLEAN_TIMEOUT_S = 60.0


def _run_id(session: str) -> str:
    """`session`'s run id, '' for none or a garbled one."""
    try:
        return run_folder.run_id(session)
    except run_folder.UnsafePath:
        return ""


def _run_ids(sessions: Collection[str]) -> set[str]:
    return {run for session in sessions if (run := _run_id(session))}


def live_runs() -> set[str]:
    """Run ids of the connected cluster's live Ray jobs (their drivers' SESSION_VAR, which
    RaySession puts in the job's metadata). Read from the GCS job table, as
    ray._private.state.job_table does, whose rows leave the metadata out."""
    accessor = ray._private.state.state._connect_and_get_accessor()
    sessions = []
    for raw in accessor.get_job_table(skip_submission_job_info_field=True,
                                      skip_is_running_tasks_field=True):
        data = gcs_pb2.JobTableData.FromString(raw)
        if not data.is_dead:
            sessions.append(data.config.metadata.get(SESSION_VAR, ""))
    return _run_ids(sessions)


def carried_runs() -> set[str]:
    """Run ids that live processes on this node carry (SESSION_VAR; other users' processes
    cannot be read, and need not be: their run folders are not ours)."""
    sessions = []
    for proc in psutil.process_iter():
        try:
            sessions.append(proc.environ().get(SESSION_VAR, ""))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return _run_ids(sessions)


def clean_node(own: str, dead: str, live: Sequence[str]) -> list[str]:
    """On this node: end the processes of the dead driver's session `dead` ('' for none), then
    remove this user's run folders in the temp dir that run_folder.stale names (`dead`'s; any
    other not `own`'s, not `live` nor `carried_runs`, unchanged for run_folder.IDLE_S);
    returns their names. A folder that fails run_folder.verify is left alone."""
    if dead:
        reap_session(dead, grace_s=0)
    base = Path(tempfile.gettempdir())
    entries = {}
    for entry in os.scandir(base):
        if entry.name.startswith(run_folder.folder_prefix()):
            try:
                entries[entry.name] = entry.stat(follow_symlinks=False).st_mtime
            except OSError:
                continue
    removed = []
    for name in run_folder.stale(entries, run_folder.run_id(own), _run_id(dead),
                                 {*live, *carried_runs()}, time.time()):
        if _remove(base / name, dead):
            removed.append(name)
    return removed


def _remove(path: Path, dead: str) -> bool:
    """Remove a stale run folder; True once it is gone. A process of the dead run that was
    still ending may have written in it while it went (run_folder.remove leaves what is made
    meanwhile): its session is reaped again and the folder removed once more."""
    for _ in range(2):
        try:
            run_folder.remove(path)
        except OSError:
            return False
        if not os.path.lexists(path):
            return True
        if dead:
            reap_session(dead, grace_s=0)
    return False


def remove_run(session: str, keep: Sequence[str] = ()) -> None:
    """On this node: remove the run folder of `session` but the entries named in `keep`."""
    run_folder.remove(run_folder.run_folder(session), keep)


_clean_node_remote = ray.remote(num_cpus=0)(clean_node)
_remove_run_remote = ray.remote(num_cpus=0)(remove_run)


def on_nodes(fn: ray.remote_function.RemoteFunction, args: tuple, node_ids: Collection[str],
             timeout_s: float = CLEAN_TIMEOUT_S) -> dict[str, Any]:
    """`fn(*args)` on each node at once; the results by node id (a node that failed or did
    not answer within timeout_s is left out: a dead node's temp dir is not ours to clean)."""
    refs = {node: fn.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
                             ).remote(*args) for node in node_ids}
    deadline = time.monotonic() + timeout_s
    results = {}
    for node, ref in refs.items():
        try:
            results[node] = ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001 - that node's cleaning is skipped, the run goes on
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - done or gone already
                pass
    return results


def alive_nodes() -> dict[str, str]:
    """{node id: node ip} of the cluster's alive nodes."""
    return {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}


def clean_stale(own: str, dead: str = "") -> list[str]:
    """Clean every alive node (`clean_node`); the run folders removed, as `<node ip>: <name>`."""
    nodes = alive_nodes()
    results = on_nodes(_clean_node_remote, (own, dead, sorted(live_runs())), nodes)
    return [f"{nodes[node]}: {name}" for node, names in results.items() for name in names]


def remove_runs(session: str, node_ids: Collection[str], keep: Sequence[str] = ()) -> None:
    """Remove `session`'s run folder on each of `node_ids` (`remove_run`)."""
    on_nodes(_remove_run_remote, (session, list(keep)), node_ids)
