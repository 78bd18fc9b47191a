"""Helpers shared by the tests (fixtures live in conftest.py): the tiny model's place, the CLI
as a child process, processes found by an environment marker, emulated multi-node Ray clusters
on loopback addresses, and reading a sweep's trial rows back.

Server tests tag every process they start with a unique environment variable and look for it
afterwards with psutil: that finds the sweep's Ray and vLLM processes (and only those).
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC
from datetime import datetime
from datetime import timedelta
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import psutil
import yaml

from framework.cluster.ports import pick_port
from framework.config.search_space import load_search_space
from framework.results.rows import TrialContext
from framework.results.rows import trial_columns
from framework.results.rows import trial_row
from framework.results.store import ResultStore
from framework.trial.objective import Verdict
from framework.trial.run import TrialOutcome

ROOT = Path(__file__).resolve().parents[1]
TINY_MODEL = ROOT / "models" / "tiny-llama"
CLI = [sys.executable, "-m", "framework.cli"]
MARKER_VAR = "VLLM_SWEEP_TEST_MARKER"
HEAD_IP = "127.0.0.9"  # emulated heads: loopback, apart from the 127.0.0.2.. workers


def marked_processes(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(MARKER_VAR) == marker:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def wait_no_marked_processes(marker: str, timeout_s: float = 45.0) -> list[str]:
    """Poll until no process carries the marker; returns descriptions of any left."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = marked_processes(marker)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(1)
    described = []
    for proc in left:
        try:
            described.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    return described


def marked_commands(marker: str, marks: tuple[str, ...]) -> dict[int, str]:
    """pid -> command line of the processes that carry the marker and whose command line
    holds one of `marks`."""
    found = {}
    for p in marked_processes(marker):
        try:
            line = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if any(mark in line for mark in marks):
            found[p.pid] = line
    return found


def engine_cores(marker: str) -> set[int]:
    """The pids of vLLM's EngineCore processes that carry the marker."""
    return set(marked_commands(marker, ("EngineCore",)))


def new_engine_core(marker: str, before: set[int], timeout_s: float) -> bool:
    """Wait for an EngineCore that is not in `before` (a server's vLLM has started its engine:
    the server is starting, not ready); whether one appeared in time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if engine_cores(marker) - before:
            return True
        time.sleep(0.2)
    return False


def vsweep_leftovers(tmp: Path) -> list[str]:
    """What vllm-sweep's processes left in the temp dir `tmp` (cli_env's TMPDIR) after a run:
    every `vsweep-*` entry (a run folder, `vsweep-<uid>-<run>`, framework/engine/run_folder.py,
    or a name of older versions) and what a run folder holds, relative to `tmp`."""
    return sorted(p.relative_to(tmp).as_posix()
                  for p in [*tmp.glob("vsweep-*"), *tmp.glob("vsweep-*/*")])


VLLM_IPC_FILE = re.compile(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}|vllm_dist_[0-9a-f]{32}")
# torch inductor's default cache (`<temp dir>/torchinductor_<user>`) and what gcc leaves of a
# compile it did not finish (cc*.o, cc*.s): a server's TMPDIR is its private folder
# (cluster.actors.private_tmp) and inductor's cache the node's cache dir (use_cache_dir)
COMPILER_FILE = re.compile(r"torchinductor_.*|cc\w{6}\.(o|s|res|c|i|ii)")
SHM = Path("/dev/shm")


def vllm_leftovers(tmp: Path) -> list[str]:
    """What vLLM's processes left in the temp dir `tmp`: ZeroMQ `ipc://` sockets (uuid4 names,
    vllm/utils/network_utils.py get_open_zmq_ipc_path), FileStore files (`vllm_dist_<hex>`,
    get_file_store_init_method), torch inductor's cache and compilers' files (COMPILER_FILE);
    a server's own folder of them is one of `vsweep_leftovers`."""
    return sorted(p.name for p in tmp.glob("*")
                  if VLLM_IPC_FILE.fullmatch(p.name) or COMPILER_FILE.fullmatch(p.name))


def shared_memory() -> set[str]:
    """Python multiprocessing's POSIX shared memory and semaphores in /dev/shm (`psm_*`,
    `sem.mp-*`): vLLM's shm_broadcast rings among them."""
    return {p.name for p in SHM.glob("*") if p.name.startswith(("psm_", "sem.mp-"))}


def cli_env(marker: str, tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({MARKER_VAR: marker, "TMPDIR": str(tmp), "RAY_AUTH_MODE": "disabled",
                "PYTHONUNBUFFERED": "1"})
    return env


def new_marker() -> str:
    return uuid.uuid4().hex


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


def _restore(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@contextlib.contextmanager
def emulated_cluster(tmp: Path, nodes: list[dict], keep_env: bool = True):
    """A Ray cluster of several nodes on this machine (ray.cluster_utils; `nodes[0]` is the
    head, later ones should set distinct `node_ip_address`es like 127.0.0.2). The head gets
    HEAD_IP unless it names its own: every node has a loopback address (Ray would otherwise give
    the head the machine's address, and servers with `host: node` would bind it), asserted
    once the nodes are up. Every process is tagged with a fresh marker; yields (cluster, gcs
    address, marker) and, on exit, shuts the cluster down and asserts none of its processes is
    left. This process's environment carries the marker and RAY_TMPDIR=`tmp` while the block
    runs, or (keep_env=False) only while the nodes start."""
    from ray.cluster_utils import Cluster

    marker = new_marker()
    saved = {k: os.environ.get(k) for k in (MARKER_VAR, "RAY_TMPDIR", "VLLM_TARGET_DEVICE")}
    os.environ[MARKER_VAR] = marker
    os.environ["RAY_TMPDIR"] = str(tmp)  # Ray's address file and sessions stay in here
    os.environ.pop("VLLM_TARGET_DEVICE", None)  # it would bypass vLLM platform plugins
    cluster = Cluster(shutdown_at_exit=True)
    try:
        # no log monitor: nothing here forwards worker logs to a driver (the product's drivers
        # say log_to_driver=False), and a long-lived head's monitor polling every log file
        # cost ~94 core-s over the suite (docs/BENCHMARKS.md, session 13); later nodes have
        # none already (ray.cluster_utils: one per physical host)
        cluster.add_node(include_dashboard=False, include_log_monitor=False,
                         **{"node_ip_address": HEAD_IP, **nodes[0]})
        for node in nodes[1:]:
            cluster.add_node(**node)
        cluster.wait_for_nodes(timeout=120)
        assert_loopback_nodes(cluster.address)
        if not keep_env:
            _restore(saved)
        yield cluster, cluster.address, marker
    finally:
        cluster.shutdown()
        _restore(saved)
        left = wait_no_marked_processes(marker)
    assert left == [], left


def assert_loopback_nodes(address: str) -> None:
    """Every node of the cluster at `address` has a loopback address (checked from a child
    process, so this process joins no cluster)."""
    code = (f"import ray; ray.init(address={address!r}, logging_level='ERROR'); "
            "print(' '.join(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, RAY_ADDRESS="")).stdout.split()
    assert out and all(ipaddress.ip_address(ip).is_loopback for ip in out), out


@dataclass(frozen=True)
class SharedRay:
    """The session's emulated one-node Ray (tests/e2e/conftest.py `shared_ray`): its GCS
    address, the marker every process of it carries, and the folder of its session files."""

    address: str
    marker: str
    folder: Path


# What a trial leaves running if its stop failed: the server actor and FakeEngine's placeholder
# workers (Ray worker processes named after their actor class), the warm-start keeper, and the
# servers themselves (`framework.engine.*` children, vLLM's EngineCore and workers).
TRIAL_PROCESS_MARKS = ("ServerActor", "FakeWorker", "ZygoteKeeper", "framework.engine",
                       "EngineCore", "VLLM::")


def trial_processes(marker: str) -> list[str]:
    """The processes of a cluster (by its marker) that belong to a trial, described."""
    return [f"{pid} {line[:120]}"
            for pid, line in marked_commands(marker, TRIAL_PROCESS_MARKS).items()]


def wait_no_trial_processes(marker: str, timeout_s: float = 45.0) -> list[str]:
    """Poll until no trial process of the cluster is left (a sweep on a shared cluster leaves
    the cluster's own processes, Ray's idle workers among them, running); returns any left."""
    deadline = time.monotonic() + timeout_s
    while (left := trial_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def join_shared(doc: dict[str, Any], ray: SharedRay,
                max_concurrent_trials: int | None = 1) -> dict[str, Any]:
    """A sweep document moved from a private Ray onto the shared one: `cluster.address` set,
    the private Ray's resources dropped, and (unless None) at most `max_concurrent_trials`
    side by side, as the private Ray's resources allowed."""
    cluster = {k: v for k, v in (doc.get("cluster") or {}).items()
               if k not in ("num_cpus", "num_gpus")}
    cluster["address"] = ray.address
    if max_concurrent_trials is not None:
        cluster.setdefault("max_concurrent_trials", max_concurrent_trials)
    return {**doc, "cluster": cluster}


def cli_joined(args: list[str], cwd: Path, marker: str,
               ray_tmp: Path) -> subprocess.CompletedProcess:
    """`vllm-sweep ARGS` in this process (cli_in_process), TMPDIR `cwd`, for a command that joins
    an emulated cluster (its processes carry `marker`; RAY_TMPDIR `ray_tmp`, its folder)."""
    return cli_in_process(*args, cwd=cwd, env=joined_cli_env(marker, cwd, ray_tmp))


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


# Tests measure each configuration once: no baseline re-measurements or confirmation runs (the
# defaults add them; tests/e2e/test_search_integration.py tests them on FakeEngine).
NO_REMEASURE = {"confirm_top": 0, "baseline_repeats": 0}


def write_sweep(tmp: Path, model: Path, n_trials: int, name: str = "e2e") -> Path:
    sweep = {
        "name": name,
        "model": str(model),
        "search_space": str(ROOT / "search_spaces" / "tiny_cpu.yaml"),
        "server": {"args": {"enforce-eager": True, "max-model-len": 512},
                   "startup_timeout_s": 240},
        "workload": {"num_prompts": 40, "input_len": 64, "output_len": 16,
                     "max_concurrency": 8, "warmup_requests": 8, "seed": 1},
        "objective": {"metric": "output_throughput", "direction": "maximize"},
        "sla": {"p99_ttft_ms": 2000, "p99_tpot_ms": 100},
        "search": {**NO_REMEASURE, "n_trials": n_trials, "seed": 3},
        "results_dir": str(tmp / "results"),
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def read_trials(results: Path, name: str) -> pd.DataFrame:
    return duckdb.sql(
        f"SELECT * FROM read_parquet('{results}/{name}/trials/**/*.parquet', hive_partitioning=true)"
        " ORDER BY trial_number").df()


def free_ports(n: int) -> list[int]:
    """n distinct ports outside the kernel's ephemeral range (ports.pick_port), so the Ray
    processes' own port-0 binds cannot take them before `ray start` binds them."""
    ports: list[int] = []
    for _ in range(n):
        ports.append(pick_port("127.0.0.1", ports))
    return ports


def group_pids(pgid: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid:
                found.append(proc)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return found


def stop_group(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM the process group of a `ray start --block`, wait, then SIGKILL what is left."""
    pgid = proc.pid
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        proc.poll()
        if not group_pids(pgid):
            break
        time.sleep(0.5)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    psutil.wait_procs(group_pids(pgid), timeout=10)


T0 = datetime(2026, 1, 1, tzinfo=UTC)


def killed_sweep_file(tmp: Path, tiny_model: Path) -> Path:
    """The sweep file of write_rows' stored sweep `killed`, results under tmp/results."""
    path = tmp / "killed.yaml"
    path.write_text(yaml.safe_dump({
        "name": "killed", "model": str(tiny_model),
        "search_space": str(ROOT / "search_spaces" / "tiny_cpu.yaml"),
        "server": {"args": {"enforce-eager": True, "max-model-len": 512}},
        "workload": {"percentiles": [50, 99]}, "search": {"n_trials": 10},
        "results_dir": str(tmp / "results")}))
    return path


def write_rows(results: Path) -> None:
    """Five stored trials of a killed sweep `killed`: baseline, a better one, a better but
    infeasible one, a start-up crash and an infeasible configuration."""
    space = load_search_space(ROOT / "search_spaces" / "tiny_cpu.yaml")
    columns = trial_columns(space, (50, 99))
    store = ResultStore(results, "killed")
    base = {"max-num-seqs": 128, "max-num-batched-tokens": 2048, "enable-chunked-prefill": True,
            "enable-prefix-caching": True}
    cases = [  # number, params, baseline, objective, feasible, fail_reason
        (0, base, True, 100.0, True, None),
        (1, {**base, "max-num-seqs": 16}, False, 150.0, True, None),
        (2, {**base, "max-num-seqs": 4}, False, 400.0, False, None),  # best value, but infeasible
        (3, {**base, "max-num-seqs": 8}, False, None, None, "startup_crash"),
        (4, {**base, "max-num-seqs": 2}, False, None, None, "infeasible"),
    ]
    for number, params, baseline, objective, feasible, fail in cases:
        outcome = TrialOutcome(started_at=T0 + timedelta(seconds=60 * number), argv=("--x",),
                               trial_s=40.0, fail_reason=fail,
                               metrics={"completed": 10, "failed": 0} if fail is None else {})
        verdict = None if fail else Verdict(objective, feasible, {}, ())
        ctx = TrialContext(number=number, params=params, is_baseline=baseline,
                           serve_command=f"vllm serve m --trial {number}", vllm_version="x",
                           server_log="")
        store.write_trial(trial_row(ctx, outcome, verdict, columns), columns)


SAMPLE = ROOT / "datasets" / "sharegpt_sample.json"


# The keys `vllm bench serve` 0.32 wrote (openai backend, no --save-detailed, --goodput given,
# --percentile-metrics ttft,e2el --metric-percentiles 50,99), in its order.
VLLM_KEYS = [
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
    "request_rate", "burstiness", "max_concurrency", "duration", "completed", "failed",
    "total_input_tokens", "total_output_tokens", "request_throughput", "request_goodput",
    "output_throughput", "total_token_throughput", "max_output_tokens_per_s",
    "max_concurrent_requests", "rtfx", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms",
    "p50_ttft_ms", "p99_ttft_ms", "mean_e2el_ms", "median_e2el_ms", "std_e2el_ms", "p50_e2el_ms",
    "p99_e2el_ms",
]


DETAIL_KEYS = ["input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "errors"]


def bench_cli(*args: str, timeout_s: float = 120,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "bench", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout_s, env=env)


def table_rows(stdout: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip("│").split("│")]
            for line in stdout.splitlines() if line.startswith("│")]


ENGINES = ["framework.engine.vllm_server", "framework.engine.fake_engine"]
VLLM_ENGINE = ENGINES[0]


def start_engine(module: str, argv: list[str], env: dict[str, str],
                 log_path: Path) -> subprocess.Popen:
    """`module.serve(argv)` (framework.engine.vllm_server or fake_engine) as a child process in
    its own session, stdout and stderr into `log_path`."""
    code = f"import sys; from {module} import serve; serve(sys.argv[1:])"
    with open(log_path, "wb") as log:
        return subprocess.Popen([sys.executable, "-c", code, *argv], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill_engine(proc: subprocess.Popen, wait_s: float = 30.0) -> list[int]:
    """SIGKILL the server's process group, wait for it; returns the pids of its process tree
    (taken before the kill) still running `wait_s` later (none, for a clean stop)."""
    tree = [proc.pid]
    try:
        tree += [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)
    deadline = time.monotonic() + wait_s
    while any(_running(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.5)
    return [p for p in tree if _running(p)]


def stop_engine(proc: subprocess.Popen, grace_s: float = 15.0) -> list[int]:
    """vLLM's own shutdown, as Ctrl-C gives it: SIGTERM to the API server only (it stops its
    EngineCore, which stops its workers, each unlinking its /dev/shm ring), up to grace_s;
    then `kill_engine` for whatever is left."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    return kill_engine(proc)


@dataclass(frozen=True)
class SharedServer:
    """The session's vLLM server (see the module docstring): where it listens, what it serves,
    the key its /v1 routes want, its control socket and log."""

    base_url: str
    model: Path
    api_key: str
    control_socket: str
    log_path: Path
    proc: subprocess.Popen

    def is_alive(self) -> bool:
        return self.proc.poll() is None


NAME = "fake-report"


def write_fake_sweep(folder: Path, model: Path, address: str | None) -> Path:
    space = folder / "space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        "max-num-seqs": {"type": "categorical", "choices": [2, 8, 128], "default": 128},
        "tensor-parallel-size": {"type": "categorical", "choices": [1, 4], "default": 1},
    }}, sort_keys=False))
    sweep = folder / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": NAME, "model": str(model), "search_space": str(space), "engine": "fake",
        "server": {"host": "node", "env": {"FAKE_ENGINE_STARTUP_S": "0",
                                            "FAKE_ENGINE_TTFT_MS": "30",
                                            "FAKE_ENGINE_TPOT_MS": "10"}},
        "workload": {"num_prompts": 32, "input_len": 8, "output_len": 32, "max_concurrency": 8,
                     "warmup_requests": 0, "request_timeout_s": 60},
        "sla": {"p99_ttft_ms": 500, "p99_tpot_ms": 50},
        # after the baseline, seed 10 proposes max-num-seqs 2 (TTFT over the SLA, so its run
        # stops early after a few requests: the report marks it and leaves it out of the
        # plots), 128, then TP 4 (cannot be placed on 2 GPUs)
        "search": {**NO_REMEASURE, "sampler": "random", "n_trials": 4, "baseline": True,
                   "seed": 10, "stop_early": True},
        "cluster": {"address": address, "max_concurrent_trials": 1},
        "results_dir": str(folder / "results"),
    }))
    return sweep


def ray_head_argv(ray: str, node_ip: str, ports: list[int], temp_dir: Path, num_cpus: int) -> list[str]:
    """`ray start --head --block` on a loopback `node_ip` (never 127.0.0.1, which `ray start`
    swaps for the machine's address) with every port given: `ports` = gcs, dashboard,
    dashboard agent, ray client; the dashboard listens on 127.0.0.1."""
    gcs_port, dash_port, agent_port, client_port = ports
    return [ray, "start", "--head", "--block", "--disable-usage-stats",
            "--node-ip-address", node_ip, "--port", str(gcs_port),
            "--temp-dir", str(temp_dir), "--num-cpus", str(num_cpus),
            "--include-dashboard", "true", "--dashboard-host", "127.0.0.1",
            "--dashboard-port", str(dash_port),
            "--dashboard-agent-listen-port", str(agent_port),
            "--ray-client-server-port", str(client_port)]


def _as_in_a_terminal() -> None:
    """Ctrl-C's default action, as in a terminal: a test run from a background job (`cmd &`)
    would otherwise hand the driver an ignored SIGINT, and Python then never raises
    KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_driver(sweep: Path, cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    """`vllm-sweep run SWEEP` as a child in its own session (stdout and stderr on one text
    pipe), to be killed by its process group; SIGINT acts as Ctrl-C in a terminal."""
    return subprocess.Popen([*CLI, "run", str(sweep)], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=_as_in_a_terminal)


def occupancy_events(path: Path) -> tuple[dict[str, float], dict[int, list[dict]]]:
    """FakeEngine's occupancy log: when each group was released (group id -> wall time), and
    each trial's device events (trial number from the event's tag, the trial's log path)."""
    events = [json.loads(line) for line in path.read_text().splitlines()]
    released = {e["group"]: e["t"] for e in events if e.get("released")}
    by_trial: dict[int, list[dict]] = defaultdict(list)
    for e in events:
        if not e.get("released"):
            by_trial[int(Path(e["tag"]).stem.split("-")[1])].append(e)
    return released, by_trial


def trials_on(text: str) -> dict[str, int]:
    """Node IP -> the first trial whose worker FakeEngine's occupancy log (its text) shows on
    that node (the trial number from the event's tag, the trial's log path); release events
    (no node) and a last line still being written are skipped."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "node_ip" in event:
            found.setdefault(event["node_ip"], int(Path(event["tag"]).stem.split("-")[1]))
    return found


def sse(payload: dict[str, Any] | str) -> bytes:
    body = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {body}\n\n".encode()


def content(text: str) -> bytes:
    return sse({"id": "cmpl-1", "choices": [{"index": 0, "text": text}]})


def usage(prompt_tokens: int, completion_tokens: int) -> bytes:
    return sse(
        {
            "id": "cmpl-1",
            "choices": [],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
        }
    )


DONE = sse("[DONE]")


def counter_clock() -> Callable[[], float]:
    """Deterministic clock: 0.0, 1.0, 2.0, ... one step per call."""
    ticks: Iterator[int] = iter(range(1_000_000))
    return lambda: float(next(ticks))
