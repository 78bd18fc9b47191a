"""The pure parts of the test helpers that tests rely on to find events (tests/sweeps.py), and
of tests/isolated_nodes.py: what an isolated node inherits and the script of its namespace."""

from __future__ import annotations

import shlex

from tests.isolated_nodes import SHARED_DIR_VARS
from tests.isolated_nodes import namespace_argv
from tests.isolated_nodes import node_env
from tests.procs import MARKER_VAR
from tests.sweeps import trials_on


def test_trials_on_skips_release_events_and_a_partial_line():
    log = ('{"t": 1.0, "node_ip": "127.0.0.3", "bundle": 0, "tag": "/r/logs/trial-00001.log"}\n'
           '{"t": 1.5, "node_ip": "127.0.0.3", "bundle": 1, "tag": "/r/logs/trial-00004.log"}\n'
           '{"t": 2.0, "group": "ab", "released": true}\n'
           '{"t": 3.0, "node_ip": "127.0.0.2", "bun')
    assert trials_on(log) == {"127.0.0.3": 1}


def test_an_isolated_node_inherits_no_shared_directory(tmp_path):
    folder = tmp_path / "n2"
    base = {"PATH": "/bin", "HF_HOME": "/repo/.cache/hf", "VLLM_CACHE_ROOT": "/repo/.cache/vllm",
            "VLLM_SWEEP_CACHE_DIR": "/repo/.cache", "XDG_CACHE_HOME": "/root/.cache",
            "RAY_ADDRESS": "127.0.0.9:6379", "TMPDIR": "/tmp", "HOME": "/root"}
    env = node_env(base, "m1", folder)
    assert not set(env) & {*SHARED_DIR_VARS, "RAY_ADDRESS"}
    assert env["TMPDIR"] == env["HOME"] == env["RAY_TMPDIR"] == str(folder)
    assert env[MARKER_VAR] == "m1" and env["PATH"] == "/bin"


def test_the_namespace_script_runs_each_step_with_its_words_quoted(tmp_path):
    parent = tmp_path / "it's $HOME"
    folder = parent / "n2"
    argv = namespace_argv(parent, folder, ["ray", "start", "--temp-dir", str(folder / "ray")])
    assert argv[argv.index("sh"):-1] == ["sh", "-c"]
    assert {"--mount", "--pid", "--fork", "--mount-proc", "--kill-child"} <= set(argv)
    script = argv[-1]
    assert script.endswith("; exit $?")  # the shell stays the namespace's first process
    steps = [shlex.split(step) for step in script.removesuffix("; exit $?").split(" && ")]
    assert steps == [["exec", "3<", str(folder)],
                     ["mount", "-t", "tmpfs", "tmpfs", str(parent)],
                     ["mkdir", "-p", str(folder)],
                     ["mount", "--no-canonicalize", "--bind", "/proc/self/fd/3", str(folder)],
                     ["exec", "3<&-"],
                     ["ray", "start", "--temp-dir", str(folder / "ray")]]
