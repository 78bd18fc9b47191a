"""The command line as a user meets it: exit codes and one-line errors, no traceback.

Most cases call `framework.cli.main` in this process (tests.cli.cli_in_process: vLLM is
imported once, not once per case); the entry point itself, `python -m framework.cli` as a
child process, is tested on the quickstart's `validate`, on `run` of one bad file (nothing
else printed on stderr, no traceback), on `bench` and on `--help`."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.cli import cli_in_process
from tests.paths import ROOT


def vllm_sweep(*args: str, cwd: Path = ROOT,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "framework.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120, env=env)


def test_validate_accepts_the_quickstart(tiny_model):
    res = vllm_sweep("validate", "sweeps/quickstart.yaml")
    assert res.returncode == 0, res.stderr
    assert "ok" in res.stdout


@pytest.mark.parametrize("text, key", [
    ("name: x\nmodel: models/tiny-llama\nsearch_space: search_spaces/tiny_cpu.yaml\n"
     "workload: {num_prompts: -3}\n",
     "workload.num_prompts"),
    ("name: x\nmodel: models/tiny-llama\nsearch_space: nowhere.yaml\n", "search_space"),
    ("name: x\nmodel: /no/such/model\nsearch_space: search_spaces/tiny_cpu.yaml\n", "model"),
    ("name: x\nmodel: [unclosed\n", "line"),
    ("name: x\nname: y\nmodel: models/tiny-llama\nsearch_space: search_spaces/tiny_cpu.yaml\n",
     "line 2"),
    ("name: x\nmodel: models/tiny-llama\nsearch_space: search_spaces/tiny_cpu.yaml\n"
     "server: {args: {num-scheduler-steps: 8}}\n", "server.args.num-scheduler-steps"),
    ("name: x\nmodel: models/tiny-llama\nsearch_space: search_spaces/tiny_cpu.yaml\n"
     "server: {args: {no-such-vllm-flag: 1}}\n", "server.args.no-such-vllm-flag"),
    ("name: x\nmodel: models/tiny-llama\nsearch_space: search_spaces/tiny_cpu.yaml\n"
     "server: {args: {tensor-parallel-size: 3}}\n", "server.args.tensor-parallel-size"),
])
def test_bad_input_is_one_line_exit_2_no_traceback(tmp_path, tiny_model, text, key):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    for command in ("validate", "run"):
        res = cli_in_process(command, str(bad))
        assert res.returncode == 2, (command, res.stdout, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1, res.stderr
        assert str(bad) in lines[0] and key in lines[0]
        assert "Traceback" not in res.stderr + res.stdout
    assert not (ROOT / "results" / "x").exists()


def test_bad_input_through_the_entry_point_is_one_line_exit_2(tmp_path, tiny_model):
    """The child process prints exactly the error line on stderr: no warning of vLLM's import,
    no traceback (a flag vLLM's own parser refuses: the path that imports vLLM; `run` and
    `validate` share it, and the quickstart's `validate` runs as a child above)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: models/tiny-llama\nsearch_space: search_spaces/tiny_cpu.yaml\n"
                   "server: {args: {no-such-vllm-flag: 1}}\n")
    res = vllm_sweep("run", str(bad))
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert str(bad) in lines[0] and "server.args.no-such-vllm-flag" in lines[0]
    assert "Traceback" not in res.stderr + res.stdout
    assert not (ROOT / "results" / "x").exists()


SWEEP = "name: x\nmodel: models/tiny-llama\nsearch_space: SPACE\n"
SPACE = "parameters:\n  max-num-seqs: {type: int, low: 1, high: 8, default: 8}\n"


@pytest.mark.parametrize("sweep, space, file, line", [
    (SWEEP + "server: {args: {max-model-len: abc}}\n", None, "bad.yaml",
     "server.args.max-model-len: 'abc': vLLM's parser: argument --max-model-len: invalid"),
    (SWEEP, "parameters:\n  kv-cache-dtype: {type: categorical, choices: [auto, fp9], "
     "default: auto}\n",
     "space.yaml", "parameters.kv-cache-dtype.choices: 'fp9': vLLM's parser: argument "
     "--kv-cache-dtype: invalid choice: 'fp9'"),
    # the default workload: 128-token prompts + 64 output tokens
    (SWEEP + "server: {args: {max-model-len: 150}}\n", None, "bad.yaml",
     "server.args.max-model-len: 150: requests of up to 128 prompt + 64 output = 192 tokens "
     "exceed max-model-len 150 in every trial"),
    (SPACE, None, "bad.yaml",
     "(top level): 'parameters': this is a search-space file (it has parameters: and no "
     "model: or search_space:), given where a sweep file belongs"),
])
def test_validate_refuses_a_bad_value_in_one_line(tmp_path, tiny_model, sweep, space, file, line):
    """Issue #17 item 5: a bad value in server.args or in a search space, or parts that
    contradict each other, fail `validate` in one line naming file, key and value."""
    space_path = tmp_path / "space.yaml"
    space_path.write_text(space or SPACE)
    bad = tmp_path / "bad.yaml"
    bad.write_text(sweep.replace("SPACE", str(space_path)))
    res = cli_in_process("validate", str(bad))
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(f"error: {tmp_path / file}: {line}"), lines[0]
    assert "Traceback" not in res.stderr + res.stdout


def test_bad_input_leaves_existing_results_untouched(tmp_path, tiny_model):
    results = tmp_path / "results" / "x"
    (results / "trials" / "sweep=x").mkdir(parents=True)
    kept = results / "trials" / "sweep=x" / "trial-00000.parquet"
    kept.write_bytes(b"PAR1 stand-in bytes")
    space = tmp_path / "space.yaml"
    space.write_text("parameters:\n  tensor-parallel-size: {type: categorical, choices: [1, 3]}\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"name: x\nmodel: {tiny_model}\nsearch_space: {space}\n"
                   f"results_dir: {tmp_path / 'results'}\nsearch: {{baseline: false}}\n")
    before = sorted((p.name, p.stat().st_mtime_ns) for p in results.rglob("*"))
    res = cli_in_process("run", str(bad))
    assert res.returncode == 2, res.stderr
    assert "parameters.tensor-parallel-size" in res.stderr and "3" in res.stderr
    assert sorted((p.name, p.stat().st_mtime_ns) for p in results.rglob("*")) == before


@pytest.mark.timeout(120)
@pytest.mark.parametrize("server, key", [
    ("{args: {api-key: sk-cli-secret}}", "server.args.api-key"),
    ("{env: {VLLM_API_KEY: sk-cli-secret}}", "server.env.VLLM_API_KEY"),
])
def test_validate_rejects_an_api_key_in_the_sweep_file_in_one_line(tmp_path, tiny_model, server,
                                                                   key):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: models/tiny-llama\nsearch_space: search_spaces/tiny_cpu.yaml\n"
                   f"server: {server}\n")
    res = cli_in_process("validate", str(bad))
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(f"error: {bad}: {key}: '<hidden>': an API key does not belong")
    assert lines[0].endswith("server.api_key_env")
    assert "sk-cli-secret" not in res.stdout + res.stderr


@pytest.fixture
def header_server() -> Iterator[tuple[str, list[str | None]]]:
    """A server on 127.0.0.1 recording each POST's Authorization header (None: absent); it
    answers 404, so the requests fail, which is enough to see what was sent."""
    seen: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append(self.headers.get("Authorization"))
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_error(404)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("openai_key, sent", [("sk-bench", "Bearer sk-bench"), (None, None)])
def test_bench_sends_openai_api_key_as_vllm_bench_does(tmp_path, tiny_model, header_server,
                                                       openai_key, sent):
    base_url, seen = header_server
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    if openai_key:
        env["OPENAI_API_KEY"] = openai_key
    res = vllm_sweep("bench", "--base-url", base_url, "--model", str(tiny_model),
                     "--num-prompts", "2", "--random-input-len", "8", "--random-output-len", "2",
                     cwd=tmp_path, env=env)
    assert res.returncode == 1, (res.stdout, res.stderr)  # every request got 404
    assert seen == [sent, sent]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_subcommand_and_argument_has_help_text():
    """`vllm-sweep <command> --help` explains every argument: the parser tree walked, every
    subcommand with a summary and every option or positional with its own help."""
    from framework.cli import parser

    top = parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    summaries = {a.dest: a.help for a in sub._choices_actions}
    commands = _subcommands(top)
    assert set(commands) >= {"run", "validate", "status", "best", "report", "plan", "doctor",
                             "build-model", "bench"}
    missing = [name for name in commands if not (summaries.get(name) or "").strip()]
    for name, command in commands.items():
        for action in command._actions:
            text = action.help
            if text is None or text == argparse.SUPPRESS or not text.strip():
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []
    for action in top._actions:
        assert action.help, action


@pytest.mark.parametrize("command", ["best", "report", "build-model", "bench"])
def test_help_prints_every_argument_with_its_text(command):
    from framework.cli import parser

    res = vllm_sweep(command, "--help")
    assert res.returncode == 0 and res.stderr == ""
    shown = " ".join(res.stdout.split())  # argparse wraps lines
    for action in _subcommands(parser())[command]._actions:
        assert all(option in shown for option in action.option_strings), action
        assert " ".join(action.help.split()[:3]) in shown, (action.help, shown)


@pytest.fixture
def own_signals() -> Iterator[None]:
    """The test's changes to SIGTERM's and SIGHUP's handlers undone after it."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_end_the_driver_as_ctrl_c_does(own_signals, signum):
    """`ray job stop` sends SIGTERM, a closed ssh session SIGHUP: both are the KeyboardInterrupt
    whose handling stops every server and records the trials in flight (#33 item 6)."""
    from framework.cli import _interrupt_on_signals

    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    _interrupt_on_signals()
    with pytest.raises(KeyboardInterrupt, match=signum.name):
        signal.raise_signal(signum)


def test_a_sighup_ignored_by_nohup_stays_ignored(own_signals):
    from framework.cli import _interrupt_on_signals

    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    _interrupt_on_signals()
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
