"""A server's stop releases its placement group whatever fails on the way, and stop_all tries
every server before it raises (cluster.server.RayServer.stop, cluster.launcher.RayLauncher.
stop_all; issue #33 item 9): a group left behind keeps its devices for the rest of the sweep.

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
    tasks answered as a healthy node answers them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.removed: list[PlacementGroup] = []
        self.killed: list[object] = []
        monkeypatch.setattr(server_mod, "group_processes", lambda group: [])
        monkeypatch.setattr(server_mod, "on_node", self.on_node)
        monkeypatch.setattr(server_mod, "remove_placement_group", self.removed.append)
        monkeypatch.setattr(server_mod.ray, "kill", lambda actor, no_restart: self.killed.append(actor))
        monkeypatch.setattr(server_mod.ray, "nodes", lambda: [
            {"NodeID": NODE_ID, "NodeManagerAddress": NODE_IP, "Alive": True}])

    @staticmethod
    def on_node(node_id: str, fn: object, *args: object, timeout_s: float = 60.0) -> object:
        if fn is server_mod._read_tail_remote:
            return b"INFO the server's last line\n", 28
        if fn is server_mod._stop_tree_remote:
            return []
        return None


def _server(log_path: Path, on_stop=lambda _: None) -> RayServer:
    return RayServer(actor=f"actor-{log_path.name}", group=PlacementGroup(
        PlacementGroupID.from_random()), serve_ref=None, base_url=f"http://{NODE_IP}:20001",
        node_ip=NODE_IP, node_id=NODE_ID, pid=4242, port=20001, placement=(NODE_IP,),
        log_path=log_path, node_log="/nonexistent/trial.log", control_path="/nonexistent/ctl",
        rpc_dir="/nonexistent/rpc", _on_stop=on_stop)


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
