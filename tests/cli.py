"""`vllm-sweep` for tests: as a child process (run_cli, cli_process, start_driver, bench_cli)
or in this process (cli_in_process; joined to an emulated cluster: cli_joined, run_joined),
and reading what it printed."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import time
from pathlib import Path

import yaml

from tests.clusters import SharedRay
from tests.clusters import join_shared
from tests.paths import CLI
from tests.paths import ROOT
from tests.procs import MARKER_VAR
from tests.procs import wait_no_trial_processes


def cli_env(marker: str, tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({MARKER_VAR: marker, "TMPDIR": str(tmp), "RAY_AUTH_MODE": "disabled",
                "PYTHONUNBUFFERED": "1"})
    return env


def run_cli(args: list[str], cwd: Path, env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout_s)


def cli_in_process(*args: str, cwd: Path = ROOT,
                   env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`vllm-sweep ARGS` as `framework.cli.main(ARGS)` in this process, in `cwd` (and with
    `env` as the whole environment, if given; both restored after): its exit code (argparse's
    SystemExit too), stdout and stderr, as run_cli returns them. vLLM is then imported once per
    pytest process instead of once per command (~10 s CPU each). A traceback is not caught:
    it fails the test. What only a child process shows (the entry point, warnings printed at
    import) is tested through run_cli in tests/unit/test_cli.py."""
    from framework.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    # `run` installs its SIGTERM and SIGHUP handlers (and Ray its own) here: put pytest's back
    saved_signals = {sig: signal.getsignal(sig)
                     for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        for sig, handler in saved_signals.items():
            signal.signal(sig, handler)
    return subprocess.CompletedProcess(["vllm-sweep", *args], code, out.getvalue(), err.getvalue())


def cli_joined(args: list[str], cwd: Path, marker: str,
               ray_tmp: Path) -> subprocess.CompletedProcess:
    """`vllm-sweep ARGS` in this process (cli_in_process), TMPDIR `cwd`, for a command that joins
    an emulated cluster (its processes carry `marker`; RAY_TMPDIR `ray_tmp`, its folder)."""
    return cli_in_process(*args, cwd=cwd, env=joined_cli_env(marker, cwd, ray_tmp))


def run_shared_sweep(ray: SharedRay, sweep: dict, tmp: Path, expect: int = 0) -> Path:
    """`sweep` joined to the shared Ray (clusters.join_shared), written as tmp/<name>.yaml and
    run (`vllm-sweep run`, run_joined); asserts its exit status is `expect`. Returns the file,
    for the commands that read its results (export, best)."""
    path = tmp / f"{sweep['name']}.yaml"
    path.write_text(yaml.safe_dump(join_shared(sweep, ray)))
    done = run_joined(ray, ["run", str(path)], tmp)
    assert done.returncode == expect, done.stdout[-3000:] + done.stderr[-3000:]
    return path


def run_joined(ray: SharedRay, args: list[str], cwd: Path,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`vllm-sweep ARGS` in this process (cli_in_process), joined to the shared Ray, with
    TMPDIR `cwd` and `env`'s variables added; asserts it left no trial process behind."""
    res = cli_in_process(*args, cwd=cwd,
                         env={**joined_cli_env(ray.marker, cwd, ray.folder), **(env or {})})
    assert wait_no_trial_processes(ray.marker) == [], res.stdout[-2000:]
    return res


def joined_cli_env(marker: str, tmp: Path, ray_tmp: Path | None = None) -> dict[str, str]:
    """cli_env for a sweep that joins a cluster through `cluster.address` (no RAY_ADDRESS);
    RAY_TMPDIR `ray_tmp` (the emulated cluster's folder) if given."""
    env = cli_env(marker, tmp)
    env.pop("RAY_ADDRESS", None)
    if ray_tmp is not None:
        env["RAY_TMPDIR"] = str(ray_tmp)
    return env


@contextlib.contextmanager
def cli_process(args: list[str], cwd: Path, env: dict[str, str]):
    """`vllm-sweep <args>` as a child process (stdout and stderr on one pipe, text); killed by
    PID if it is still running when the block ends."""
    proc = subprocess.Popen([*CLI, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def read_until(proc: subprocess.Popen, text: str, timeout_s: float) -> str:
    """Read a child's stdout lines until `text` appears (or EOF, or the deadline)."""
    seen = ""
    deadline = time.monotonic() + timeout_s
    while text not in seen and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen += line
    return seen


def bench_cli(*args: str, timeout_s: float = 120,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "bench", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout_s, env=env)


def table_rows(stdout: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip("│").split("│")]
            for line in stdout.splitlines() if line.startswith("│")]


def _as_in_a_terminal() -> None:
    """Ctrl-C's default action, as in a terminal: a test run from a background job (`cmd &`)
    would otherwise hand the driver an ignored SIGINT, and Python then never raises
    KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def kill_driver(proc: subprocess.Popen) -> None:
    """kill -9 of the driver alone (not its group): what it started is orphaned."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def end_driver(proc: subprocess.Popen) -> None:
    """SIGKILL to a driver's process group if it still runs (a test's cleanup)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def start_driver(sweep: Path, cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    """`vllm-sweep run SWEEP` as a child in its own session (stdout and stderr on one text
    pipe), to be killed by its process group; SIGINT acts as Ctrl-C in a terminal."""
    return subprocess.Popen([*CLI, "run", str(sweep)], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=_as_in_a_terminal)
