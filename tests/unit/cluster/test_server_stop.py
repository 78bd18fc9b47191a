"""A server's stop releases its placement group whatever fails on the way, and stop_all tries
every server before it raises (cluster.server.RayServer.stop, cluster.launcher.RayLauncher.
stop_all; issue #33 item 9): a group left behind keeps its devices for the rest of the sweep.
Processes a stop could not end are recorded, and name the devices of a server placed after
them on their node as held (RayLauncher.devices_held; #32 item 5).

The servers, the launcher, the placement groups' ids and the failing log append are real;
`FakeRay` stands in for the Ray cluster (GCS, nodes, remote tasks), which unit tests do not
start."""

from __future__ import annotations

from pathlib import Path

import pytest
from ray._raylet import PlacementGroupID
from ray.util.placement_group import PlacementGroup

from framework.cluster import server as server_mod
from framework.cluster.launcher import RayLauncher
from framework.cluster.server import RayServer

NODE_ID, NODE_IP = "ab" * 28, "10.0.0.7"


class FakeRay:
    """Ray's side of a stop, recorded: one live node, no worker actors in any group, remote
    tasks answered as a healthy node answers them; `left`: pids the stop of the actor's tree
    could not end, `running`: pids running on the node."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, left: tuple[int, ...] = ()) -> None:
        self.left, self.running = list(left), set(left)
        self.removed: list[PlacementGroup] = []
        self.killed: list[object] = []
        monkeypatch.setattr(server_mod, "group_processes", lambda group: [])
        monkeypatch.setattr(server_mod, "on_node", self.on_node)
        monkeypatch.setattr(server_mod, "remove_placement_group", self.removed.append)
        monkeypatch.setattr(server_mod.ray, "kill", lambda actor, no_restart: self.killed.append(actor))
        monkeypatch.setattr(server_mod.ray, "nodes", lambda: [
            {"NodeID": NODE_ID, "NodeManagerAddress": NODE_IP, "Alive": True}])

    def on_node(self, node_id: str, fn: object, *args: object, timeout_s: float = 60.0) -> object:
        if fn is server_mod._read_tail_remote:
            return b"INFO the server's last line\n", 28
        if fn is server_mod._stop_tree_remote:
            return list(self.left)
        if fn is server_mod._running_remote:
            return [pid for pid in args[0] if pid in self.running]  # type: ignore[attr-defined]
        return None


def _server(log_path: Path, on_stop=lambda _: None, held=lambda _: "", node_ip: str = NODE_IP,
            placed_at: float = 0.0) -> RayServer:
    return RayServer(actor=f"actor-{log_path.name}", group=PlacementGroup(
        PlacementGroupID.from_random()), serve_ref=None, base_url=f"http://{node_ip}:20001",
        node_ip=node_ip, node_id=NODE_ID, pid=4242, port=20001, placement=(node_ip,),
        log_path=log_path, node_log="/nonexistent/trial.log", control_path="/nonexistent/ctl",
        folder="/nonexistent/s4242-x", _on_stop=on_stop, _held=held, placed_at=placed_at)


def _unwritable_log(tmp_path: Path) -> Path:
    """A log path whose folder cannot be made: a file holds its name (a real OSError)."""
    (tmp_path / "blocked").write_text("not a folder")
    return tmp_path / "blocked" / "trial-00001.log"


def test_a_failing_log_append_still_releases_the_group(monkeypatch, tmp_path) -> None:
    ray = FakeRay(monkeypatch)
    told: list[RayServer] = []
    server = _server(_unwritable_log(tmp_path), told.append)
    with pytest.raises(OSError):
        server.stop()
    assert ray.removed == [server.group] and told == [server] and ray.killed == [server.actor]
    assert server.released_at is not None
    assert server.stop() == [] and ray.removed == [server.group]  # once only


def test_a_stop_that_goes_well_fetches_the_log_then_releases(monkeypatch, tmp_path) -> None:
    ray = FakeRay(monkeypatch)
    server = _server(tmp_path / "logs" / "trial-00002.log")
    assert server.stop() == []
    assert server.log_path.read_bytes() == b"INFO the server's last line\n"
    assert ray.removed == [server.group]


def test_stop_all_stops_every_server_then_raises_the_first_error(monkeypatch, tmp_path) -> None:
    ray = FakeRay(monkeypatch)
    launcher = RayLauncher(env={}, host="127.0.0.1", engine="fake")
    failing = _server(_unwritable_log(tmp_path), launcher._release)
    healthy = _server(tmp_path / "logs" / "trial-00002.log", launcher._release)
    for server in (failing, healthy):
        launcher._active[id(server)] = server
    with pytest.raises(OSError) as raised:
        launcher.stop_all()
    assert ray.removed == [failing.group, healthy.group] and launcher._active == {}
    assert "1 of 2 server stops failed" in raised.value.__notes__
    assert healthy.log_path.is_file()


def test_processes_a_stop_left_make_a_later_server_there_find_its_devices_held(monkeypatch,
                                                                              tmp_path) -> None:
    """Held: a server placed after the survivors' group was removed, on their node; not one
    placed before (it held other devices meanwhile) or on another node. Once the survivors
    are gone, they are named once more (they may have ended after that server's start-up
    check), then forgotten."""
    ray = FakeRay(monkeypatch, left=(4321,))
    launcher = RayLauncher(env={}, host="127.0.0.1", engine="fake")
    old = _server(tmp_path / "trial-00001.log", launcher._release)
    assert old.stop() == [4321] and old.survivors == {NODE_ID: [4321]}
    assert ray.removed == [old.group] and old.released_at is not None

    def later(name: str, node_ip: str = NODE_IP, after: float = 1.0) -> RayServer:
        return _server(tmp_path / name, launcher._release, launcher.devices_held, node_ip,
                       old.released_at + after)

    held = later("trial-00002.log").devices_held()
    assert f"devices on {NODE_IP} were handed on" in held
    assert "pids [4321] of the server of trial-00001.log still ran" in held
    assert later("trial-00003.log", after=-1.0).devices_held() == ""
    assert later("trial-00004.log", node_ip="10.0.0.8").devices_held() == ""
    ray.running.clear()  # the survivor ended
    assert later("trial-00005.log").devices_held() == held
    assert later("trial-00006.log").devices_held() == ""


def test_a_clean_stop_leaves_no_devices_held(monkeypatch, tmp_path) -> None:
    FakeRay(monkeypatch)
    launcher = RayLauncher(env={}, host="127.0.0.1", engine="fake")
    old = _server(tmp_path / "trial-00001.log", launcher._release)
    assert old.stop() == [] and old.survivors == {}
    assert _server(tmp_path / "trial-00002.log", launcher._release, launcher.devices_held,
                   placed_at=(old.released_at or 0.0) + 1).devices_held() == ""
