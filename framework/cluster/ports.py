"""Server ports: picking one on a node, and claiming it among concurrent launches. No Ray.

A port picked by binding port 0 comes from the kernel's ephemeral range, which the kernel keeps
handing out: between the pick and the server's own bind (seconds, while it imports and parses),
any process on the node that binds port 0 (Ray's workers on test clusters, vLLM's internal
sockets) may be given the same port, and the server fails with "address already in use". So
servers get ports from `SERVER_PORTS`, outside the ephemeral range, which only explicit binds
reach (vLLM issue 8204 is the same race inside vLLM).
"""

from __future__ import annotations

import random
import socket
import threading
from collections.abc import Callable
from collections.abc import Collection
from pathlib import Path

from framework.base.errors import TrialError

# Above Ray's default worker ports (10002-19999), below Linux's default ephemeral range.
SERVER_PORTS = range(20000, 30000)
DEFAULT_EPHEMERAL = (32768, 60999)
TRIES = 100


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The kernel's range for port-0 binds (Linux's default where it cannot be read)."""
    try:
        low, high = path.read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL


def _binds(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(host: str, taken: Collection[int], ports: range = SERVER_PORTS,
              ephemeral: tuple[int, int] | None = None, rng: random.Random | None = None) -> int:
    """A port of `ports` outside `ephemeral` (default: this kernel's range), not in `taken`,
    that binds on `host` now; up to TRIES random candidates. If none binds: a port-0 pick (the
    race above is then possible again, but the trial still gets a port)."""
    low, high = ephemeral or ephemeral_range()
    candidates = [p for p in ports if not low <= p <= high and p not in taken]
    for port in (rng or random.Random()).sample(candidates, min(TRIES, len(candidates))):
        if _binds(host, port):
            return port
    for _ in range(TRIES):
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port not in taken:
            break
    return port


def claim_port(claimed: set[tuple[str, int]], lock: threading.Lock,
               pick: Callable[[list[int]], dict], attempts: int = 5) -> dict:
    """Claim `(info["node_id"], info["port"])` in `claimed` for `info = pick(taken)`.

    Launches run concurrently and a pick cannot see a port that another launch picked but has
    not claimed yet, so the check and the claim are one step under `lock`; a port already
    claimed on that node is picked again (same port on another node is fine)."""
    for _ in range(attempts):
        with lock:
            taken = [port for _, port in claimed]
        info = pick(taken)
        with lock:
            if (key := (info["node_id"], info["port"])) not in claimed:
                claimed.add(key)
                return info
    raise TrialError("startup_crash", f"no free port on node {info['node_ip']} in {attempts} picks")
