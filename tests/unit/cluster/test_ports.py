"""Server ports: picking one outside the kernel's ephemeral range (ports.pick_port, on real
sockets) and claiming it when launches race (ports.claim_port; no Ray)."""

from __future__ import annotations

import socket
import threading
from contextlib import ExitStack

import pytest

from framework.base.errors import TrialError
from framework.cluster.ports import DEFAULT_EPHEMERAL
from framework.cluster.ports import claim_port
from framework.cluster.ports import ephemeral_range
from framework.cluster.ports import pick_port

HOST = "127.0.0.9"  # a loopback address no other test binds on


BASE = 23450  # outside the default ephemeral range


def held(stack: ExitStack, *ports: int) -> None:
    """Listen on these ports of HOST until the stack closes (a running server's hold)."""
    for port in ports:
        sock = stack.enter_context(socket.socket())
        sock.bind((HOST, port))
        sock.listen()


def test_ephemeral_range_read_from_the_kernel_file(tmp_path):
    (tmp_path / "range").write_text("1024\t65000\n")
    assert ephemeral_range(tmp_path / "range") == (1024, 65000)
    assert ephemeral_range(tmp_path / "missing") == DEFAULT_EPHEMERAL


def test_pick_skips_the_ephemeral_range_taken_ports_and_ports_in_use():
    with ExitStack() as stack:
        held(stack, BASE + 7, BASE + 8)
        picks = {pick_port(HOST, taken={BASE + 5, BASE + 6}, ports=range(BASE, BASE + 10),
                           ephemeral=(BASE, BASE + 4)) for _ in range(20)}
    assert picks == {BASE + 9}


def test_pick_falls_back_to_a_kernel_port_when_the_range_is_busy():
    with ExitStack() as stack:
        held(stack, BASE, BASE + 1)
        port = pick_port(HOST, taken=[], ports=range(BASE, BASE + 2), ephemeral=DEFAULT_EPHEMERAL)
    low, high = ephemeral_range()
    assert low <= port <= high


def picks(*ports: tuple[str, int]):
    """A `pick` returning these (node, port) in turn and recording the `taken` it was given."""
    seen: list[list[int]] = []
    queue = list(ports)

    def pick(taken: list[int]) -> dict:
        seen.append(sorted(taken))
        node, port = queue.pop(0)
        return {"node_id": node, "node_ip": f"ip-{node}", "port": port}
    return pick, seen


def test_a_port_claimed_meanwhile_on_the_same_node_is_picked_again():
    # another launch claimed n1:5000 after this launch's pick had started, blind to it
    claimed = {("n1", 5000)}
    pick, seen = picks(("n1", 5000), ("n1", 5001))
    info = claim_port(claimed, threading.Lock(), pick)
    assert info["port"] == 5001
    assert claimed == {("n1", 5000), ("n1", 5001)}
    assert seen == [[5000], [5000]]


def test_the_same_port_on_another_node_is_claimed():
    claimed = {("n1", 5000)}
    pick, _ = picks(("n2", 5000))
    assert claim_port(claimed, threading.Lock(), pick)["port"] == 5000
    assert claimed == {("n1", 5000), ("n2", 5000)}


def test_no_free_port_after_every_attempt_is_a_trial_error():
    claimed = {("n1", 5000)}
    pick, seen = picks(*[("n1", 5000)] * 3)
    with pytest.raises(TrialError) as err:
        claim_port(claimed, threading.Lock(), pick, attempts=3)
    assert (err.value.reason, err.value.detail) == ("startup_crash", "no free port on node ip-n1 in 3 picks")
    assert len(seen) == 3 and claimed == {("n1", 5000)}


def test_racing_launches_never_share_a_port():
    """Eight threads whose picks all overlap and all first return the same port: one claims
    it, the others pick again (each thread's second pick is its own)."""
    claimed: set[tuple[str, int]] = set()
    lock = threading.Lock()
    barrier = threading.Barrier(8)
    got: list[int] = []

    def launch(i: int) -> None:
        calls = iter([5000, 6000 + i])

        def pick(taken: list[int]) -> dict:
            port = next(calls)
            if port == 5000:
                barrier.wait(timeout=10)  # every launch has picked before any claims
            return {"node_id": "n1", "node_ip": "ip-n1", "port": port}
        got.append(claim_port(claimed, lock, pick)["port"])

    threads = [threading.Thread(target=launch, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert len(got) == 8 and len(set(got)) == 8 and got.count(5000) == 1
    assert claimed == {("n1", p) for p in got}
