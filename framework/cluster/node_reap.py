"""Ending a trial server's processes on its node (run there as Ray tasks by cluster.server):
vLLM shut down by its own SIGTERM handling first, then whatever is left reaped by PID.

Why vLLM's own shutdown first: `ray.kill` of the server actor makes Ray's raylet SIGKILL the
worker's children (kill_child_processes_on_worker_exit), and a SIGKILLed vLLM leaves its
shm_broadcast rings (`/dev/shm/psm_*`: 160 and 240 MiB here, their written pages held in RAM),
semaphores, IPC sockets and FileStore file behind, on every stop. Trial after trial the
node's /dev/shm fills, until vLLM refuses to start (shm_broadcast.py check_shm_free_space).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path

import ray

from framework.engine.process_record import ProcessRecord
from framework.engine.process_record import still_recorded
from framework.engine.zygote import group_file
from framework.engine.zygote import is_zygote_process
from framework.engine.zygote import served_group
from framework.engine.zygote import served_record

# How long vLLM may take to shut down on SIGTERM before its processes are killed (`stop_tree`),
# and a stopped server's resource tracker to clean up after its clients (`reap`).
SHUTDOWN_GRACE_S = 15.0
TRACKER_GRACE_S = 5.0


def process_tree(pid: int, record: Path) -> list[int]:
    """The actor `pid`, its descendants, and the server a zygote forked for it (`warm_start`:
    the zygote forks and shims of its process group, recorded in `record`, the server's
    `group_file`, framework.engine.zygote, with their descendants, e.g. multiprocessing's
    resource tracker)."""
    import psutil

    found: list[int] = []
    try:
        root = psutil.Process(pid)
        found = [pid, *(p.pid for p in root.children(recursive=True))]
    except psutil.NoSuchProcess:
        pass
    group = served_group(record)
    if group is not None:
        for proc in psutil.process_iter():
            try:
                if os.getpgid(proc.pid) == group and is_zygote_process(proc.cmdline()):
                    found += [proc.pid, *(p.pid for p in proc.children(recursive=True))]
            except (ProcessLookupError, psutil.Error):
                pass
        found = list(dict.fromkeys(found))
        record.unlink(missing_ok=True)
    return found


def _running(proc) -> bool:  # noqa: ANN001 - a psutil.Process (psutil is imported on the node)
    """Alive and not a zombie: a zombie holds no memory or device, only its parent's wait."""
    import psutil

    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(procs: list, timeout_s: float) -> list:
    """Poll until none of `procs` runs (`_running`) or timeout_s passes; the ones still running."""
    deadline = time.monotonic() + timeout_s
    while (alive := [p for p in procs if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def _is_resource_tracker(proc) -> bool:  # noqa: ANN001 - a psutil.Process
    """multiprocessing's resource tracker (`-c 'from multiprocessing.resource_tracker import
    main;main(fd)'`)."""
    import psutil

    try:
        return any("multiprocessing.resource_tracker" in part for part in proc.cmdline())
    except psutil.Error:
        return False


def _kill(procs: list) -> list:
    """SIGKILL `procs`; the ones still running 5 s later."""
    import psutil

    for proc in procs:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    return _wait_gone(procs, 5.0)


def reap(pids: list[int], grace_s: float, signal_first: bool = True) -> list[int]:
    """SIGTERM pids (unless not `signal_first`: then only wait), wait up to grace_s for them to
    be gone (exited, or zombies: not reaped by a parent that is not ours), SIGKILL the rest;
    returns pids still running. multiprocessing's resource trackers among them go last, on
    their own: a tracker ignores SIGTERM, and once every process that holds its pipe is gone
    it unlinks the shared memory and semaphores they left (vLLM's shm_broadcast rings,
    /dev/shm/psm_*: up to 240 MiB each) and exits. SIGKILLed, it would leave them in /dev/shm
    for good. TRACKER_GRACE_S bounds that wait."""
    import psutil

    procs, trackers = [], []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if _is_resource_tracker(proc):
                trackers.append(proc)
                continue
            if signal_first:
                proc.send_signal(signal.SIGTERM)
            procs.append(proc)
        except psutil.NoSuchProcess:
            pass
    left = _kill(_wait_gone(procs, grace_s))
    left += _kill(_wait_gone(trackers, TRACKER_GRACE_S))
    return [p.pid for p in left]


def shutdown_targets(actor_pid: int, parents: Mapping[int, int | None], group: int | None
                     ) -> list[int]:
    """Whom `shut_down` sends SIGTERM: the API server a zygote forked (`group`, the leader of
    the served process group), else the actor's own children (EngineCore when the API server
    runs in the actor, the API server when it runs in a child). `parents`: pid -> parent pid
    of the tree's processes but the actor and resource trackers. Sent to every process alike,
    the signal would race: a worker ending first makes EngineCore fail, and its ring stays in
    /dev/shm."""
    if group is not None:
        return [group]
    return [pid for pid, parent in parents.items() if parent == actor_pid]


def shut_down(pid: int, tree: list[int], leader: ProcessRecord | None, grace_s: float) -> None:
    """vLLM's own shutdown, as `vllm serve` gets it from Ctrl-C: SIGTERM to
    `shutdown_targets`, then wait up to grace_s for them and the rest of `tree` to exit. vLLM
    stops its processes in order and each unlinks the shared memory it created. The actor
    itself (Ray's worker) and resource trackers (`reap`) are left alone. `leader`: the served
    group's recorded leader (`served_record`); signalled only while its pid still names it
    (`still_recorded`: a stale record's pid may be another user's process by now)."""
    import psutil

    procs = []
    for member in tree:
        try:
            proc = psutil.Process(member)
            if member != pid and not _is_resource_tracker(proc):
                procs.append(proc)
        except psutil.NoSuchProcess:
            pass
    # None too when the zygote's fork has ended already, or its pid was given to another
    group = leader.pid if leader is not None and still_recorded(leader) else None
    tops = []
    for target in shutdown_targets(pid, {p.pid: _parent(p) for p in procs}, group):
        try:
            proc = psutil.Process(target)
            # checked again once psutil holds it: from here send_signal refuses a reused pid
            if leader is not None and target == group and not still_recorded(leader):
                continue
            proc.send_signal(signal.SIGTERM)
            tops.append(proc)
        except psutil.NoSuchProcess:
            pass
    _wait_gone([*procs, *tops], grace_s)


def _parent(proc) -> int | None:  # noqa: ANN001 - a psutil.Process
    import psutil

    try:
        return proc.ppid()
    except psutil.NoSuchProcess:
        return None


def stop_tree(pid: int, actor: ray.actor.ActorHandle, grace_s: float, folder: str) -> list[int]:
    """The server actor's tree ended in one task on its node (`folder`: the server's own, where
    its process group is recorded, engine.zygote.group_file): the tree found while the actor
    (pid) still runs, vLLM shut down (`shut_down`, up to SHUTDOWN_GRACE_S), the actor
    killed through Ray (so Ray records an intended death; its raylet SIGKILLs the worker's
    children as it goes, which would leave vLLM's shared memory in /dev/shm), then what is
    left `reap`ed; returns pids still alive. The actor's own process is only waited for
    (SIGKILLed after grace_s): Ray ends it, and a SIGTERM of ours while it does made Ray report
    "A worker died or was killed ... by an unexpected system error" on the driver's console."""
    record = group_file(Path(folder))
    leader = served_record(record)
    tree = process_tree(pid, record)
    shut_down(pid, tree, leader, SHUTDOWN_GRACE_S)
    ray.kill(actor, no_restart=True)
    return end_tree(tree, pid, grace_s)


def end_tree(tree: list[int], actor_pid: int, grace_s: float) -> list[int]:
    """`reap` the tree but the actor, whose process exits as Ray ends it: waited for, never
    signalled before grace_s; returns pids still alive."""
    others = [p for p in tree if p != actor_pid]
    return reap(others, grace_s) + reap([actor_pid] if actor_pid in tree else [], grace_s,
                                        signal_first=False)


def await_exit(pids: list[int], grace_s: float) -> list[int]:
    """Wait for these actor processes on this node to exit (their owner died, Ray ends them),
    SIGKILL any still there after grace_s; returns pids still alive."""
    return reap(pids, grace_s, signal_first=False)
