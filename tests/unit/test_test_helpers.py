"""The pure parts of tests/helpers.py that tests rely on to find events."""

from __future__ import annotations

from tests.helpers import trials_on


def test_trials_on_skips_release_events_and_a_partial_line():
    log = ('{"t": 1.0, "node_ip": "127.0.0.3", "bundle": 0, "tag": "/r/logs/trial-00001.log"}\n'
           '{"t": 1.5, "node_ip": "127.0.0.3", "bundle": 1, "tag": "/r/logs/trial-00004.log"}\n'
           '{"t": 2.0, "group": "ab", "released": true}\n'
           '{"t": 3.0, "node_ip": "127.0.0.2", "bun')
    assert trials_on(log) == {"127.0.0.3": 1}
