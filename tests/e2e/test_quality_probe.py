"""One real sweep of the tiny model on vLLM CPU servers, on the session's shared Ray, through the
real runner (ask -> trial -> probe -> row -> tell) with real Parquet, read by several tests.
The runner runs in this process with the real RayLauncher, warm start on, so that its trials
can be enqueued by hand (the module fixture `sweep`); each test reads what it left:

- issue #17 item 6's acceptance: the quality probe fails fp8 KV cache against its threshold
  and passes an output-preserving change (`--max-num-seqs 4`, marked `lossy: true` in this
  test's space so that it is probed: the probe must pass it), against the baseline (vLLM's
  defaults);
- out of KV cache memory at start-up: FAIL(oom_at_startup) naming vLLM's own numbers;
- a server whose EngineCore is killed in the middle of the load, then the node's warm zygote
  (as by the OOM killer): FAIL(server_died) with the log tail and the request rows measured so
  far; the next trial finds the zygote dead, starts another, completes, still warm_start, and
  the new zygote ends with the sweep.

Five trials, one at a time, on one zygote and then its replacement: 0 the baseline, 1 the
OOM (two KV blocks), 2 the one killed (request-rate 1, so that its load lasts ~16 s: the kill
lands mid-load even when a loaded machine delays the killer's first count of answers by
several seconds; at 2 req/s, ~6 s of delay let the load end first), 3 fp8 KV cache (the first
on the new zygote), 4 max-num-seqs 4. A killer thread follows the runner's console and kills
trial 2's processes.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

import duckdb
import pandas as pd
import psutil
import pytest
import yaml
from rich.console import Console

from framework.cluster import RayLauncher
from framework.cluster import RaySession
from framework.engine.zygote import FOLDER_PREFIX
from framework.load.http_client import get_sync
from framework.results.html_report import render_report
from framework.sweep.loader import Sweep
from framework.sweep.loader import load
from framework.sweep.loader import server_env
from framework.sweep.runner import Runner
from tests.clusters import SharedRay
from tests.clusters import join_shared
from tests.procs import wait_no_trial_processes
from tests.sweeps import NO_REMEASURE

pytestmark = pytest.mark.timeout(900)  # the first test runs the module's sweep
NUM_PROMPTS = 16
BASELINE, OOM, KILLED, FP8, SEQS = range(5)
FAST, SLOW = 1000.0, 1.0  # request rates: as good as unpaced for 16 prompts; ~16 s of load


def write_sweep(tmp: Path, model: Path, ray: SharedRay) -> Path:
    space = tmp / "space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        "max-num-seqs": {"type": "categorical", "choices": [2, 4, 128], "default": 128,
                         "lossy": True},
        "kv-cache-dtype": {"type": "categorical", "choices": ["auto", "fp8"], "default": "auto"},
        # two KV blocks (of 16 tokens) cannot hold one 512-token sequence: only with 2 seqs
        "num-gpu-blocks-override": {"type": "categorical", "choices": [2],
                                    "when": {"max-num-seqs": 2}},
        "request-rate": {"type": "categorical", "kind": "run", "choices": [SLOW, FAST],
                         "default": FAST},
    }}, sort_keys=False))
    sweep = tmp / "sweep.yaml"
    sweep.write_text(yaml.safe_dump(join_shared({
        "name": "quality", "model": str(model), "search_space": str(space), "engine": "cpu",
        "server": {"args": {"enforce-eager": True, "max-model-len": 512}, "reuse": False,
                   "startup_timeout_s": 240},
        "workload": {"num_prompts": NUM_PROMPTS, "input_len": 32, "output_len": 8,
                     "warmup_requests": 2, "max_concurrency": 4, "seed": 0},
        "sla": {"min_token_agreement": 0.95},
        "search": {**NO_REMEASURE, "sampler": "random", "n_trials": 5, "seed": 0},
        # the request rate is searched only to make trial 2's load last (SLOW): not ranked
        "objective": {"allow_load_bound": True},
        "results_dir": str(tmp / "results")}, ray)))
    return sweep


TRIALS = [  # after the baseline, in order
    {"max-num-seqs": 2, "kv-cache-dtype": "auto", "num-gpu-blocks-override": 2,
     "request-rate": FAST},
    {"max-num-seqs": 128, "kv-cache-dtype": "auto", "request-rate": SLOW},
    {"max-num-seqs": 128, "kv-cache-dtype": "fp8", "request-rate": FAST},
    {"max-num-seqs": 4, "kv-cache-dtype": "auto", "request-rate": FAST},
]


@dataclass
class Kills:
    """What the killer thread did: the zygote it killed, the EngineCores it killed before it,
    whether the server had answered some measured requests first, the zygote the next trial
    started; both zygotes' folders; what went wrong, if anything."""

    old: psutil.Process | None = None
    engines: list[int] = field(default_factory=list)
    answered: bool = False
    new: list[psutil.Process] = field(default_factory=list)
    folders: list[Path] = field(default_factory=list)
    error: str = ""
    over: threading.Event = field(default_factory=threading.Event)  # the sweep has ended


@dataclass(frozen=True)
class Run:
    sweep: Sweep
    out: str
    kills: Kills
    left: list[str]
    folder: Path


@pytest.fixture(scope="module")
def sweep(shared_ray: SharedRay, tiny_model: Path) -> Iterator[Run]:
    tmp = Path(tempfile.mkdtemp(prefix="vst-"))  # short: Ray's socket paths
    try:
        yield _run(shared_ray, tiny_model, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run(ray: SharedRay, model: Path, tmp: Path) -> Run:
    sweep = load(write_sweep(tmp, model, ray), check_flags=False)
    out, kills = io.StringIO(), Kills()
    killer = threading.Thread(target=_kill_trial_2, args=(out, kills), daemon=True)
    sigterm = signal.getsignal(signal.SIGTERM)  # ray.init installs its own handler here
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.setenv("RAY_TMPDIR", str(ray.folder))
        mp.setenv("RAY_AUTH_MODE", "disabled")
        mp.delenv("RAY_ADDRESS", raising=False)
        with RaySession(ray.address):
            launcher = RayLauncher(env=server_env(sweep.spec), host="node", engine="cpu",
                                   warm_start=True)
            runner = Runner(sweep, launcher, Console(file=out, width=200))
            runner.tuner.enqueue_baseline(sweep.space.defaults())
            runner.tuner.enqueue_new(TRIALS)
            killer.start()
            try:
                runner.run(1 + len(TRIALS))
            finally:
                kills.over.set()
                launcher.stop_all()
                launcher.close()
    signal.signal(signal.SIGTERM, sigterm)
    killer.join(timeout=60)
    return Run(sweep, out.getvalue(), kills, wait_no_trial_processes(ray.marker), tmp)


def _kill_trial_2(out: io.StringIO, kills: Kills) -> None:
    """Once trial KILLED's server has answered 3 measured requests, SIGKILL its EngineCore,
    then the zygote that forked it; then note the zygote trial FP8 runs on."""
    try:
        _until(lambda: f"trial {KILLED}: under load" in out.getvalue(), kills.over)
        old = _zygotes()
        assert len(old) == 1, old
        kills.old = old[0]
        kills.folders.append(_folder(old[0]))
        url = vllm_metrics_url(old[0])
        assert url is not None, "no vLLM server found below the zygote"
        kills.answered = served(url, answered(url) + 3, timeout_s=120)
        engines = [p for p in old[0].children(recursive=True) if "EngineCore" in _line(p)]
        kills.engines = [p.pid for p in engines]
        for p in engines:
            p.kill()
        old[0].kill()
        old[0].wait(timeout=30)
        _until(lambda: f"trial {FP8}: under load" in out.getvalue(), kills.over)
        kills.new = _zygotes()
        kills.folders += [_folder(p) for p in kills.new]
    except Exception as exc:  # noqa: BLE001 - the tests report it
        kills.error = f"{type(exc).__name__}: {exc}"


def _until(done: Callable[[], bool], over: threading.Event) -> None:
    """Wait for `done`, as long as the sweep runs."""
    while not done():
        if over.wait(0.2):
            raise TimeoutError("the sweep ended first")


def test_the_probe_fails_fp8_kv_cache_and_passes_a_max_num_seqs_change(sweep: Run,
                                                                        short_tmp: Path) -> None:
    assert sweep.left == [], sweep.out[-3000:]
    trials = sweep.sweep.store.read_trials().set_index("trial_number")
    assert list(trials.index) == [0, 1, 2, 3, 4], trials[["state", "fail_reason"]]
    measured = trials.loc[[BASELINE, FP8, SEQS]]
    assert list(measured["state"]) == ["COMPLETE"] * 3, measured[["fail_reason", "fail_detail"]]
    assert measured["server_pid"].nunique() == 3 and not measured["server_reused"].any()
    baseline, fp8, seqs = trials.loc[BASELINE], trials.loc[FP8], trials.loc[SEQS]
    assert (fp8["param_kv_cache_dtype"], seqs["param_max_num_seqs"]) == ("fp8", 4)
    itself = baseline["quality_baseline_agreement"]
    assert baseline["token_agreement"] == itself and baseline["quality_ok"]
    for row in (fp8, seqs):  # judged against the baseline's own noise floor and the SLA
        assert row["quality_baseline_agreement"] == itself
        assert row["quality_required"] == pytest.approx(min(0.95, itself - 0.02))
        assert row["quality_ok"] == (row["token_agreement"] >= row["quality_required"])
    for number, row in measured.iterrows():
        print(f"trial {number}: start-up {row['startup_s']:.0f} s, load {row['bench_s']:.1f} s, "
              f"whole trial (probe included) {row['trial_s']:.0f} s")
    print(f"token agreement: baseline with itself {itself:.3f}, fp8 {fp8['token_agreement']:.3f}"
          f" (MAD {fp8['logprob_mad']:.4f} nats), max-num-seqs 4 {seqs['token_agreement']:.3f}")

    # fp8 KV cache changes the greedy outputs: the probe fails it, and so does the SLA
    assert fp8["quality_note"] == "changes kv-cache-dtype"
    assert not fp8["quality_ok"] and not fp8["feasible"]
    assert "min_token_agreement" in fp8["sla_violations"]
    # max-num-seqs 4 changes batching only: the probe passes it
    assert seqs["quality_note"] == "changes max-num-seqs"
    assert seqs["quality_ok"] and seqs["feasible"] and seqs["sla_violations"] == ""

    probes = sweep.sweep.store.read_probes()
    runs = {(r["trial_number"], r["run"], r["concurrency"]) for r in probes}
    assert runs == {(BASELINE, 0, 8), (BASELINE, 1, 1), (FP8, 0, 8), (SEQS, 0, 8)}
    assert len(probes) == 4 * 16 and all(len(r["token_ids"]) == 32 for r in probes)

    page = render_report(sweep.sweep.store.read_trials(), sweep.sweep.spec, None,
                         short_tmp / "report.html").read_text()
    assert "<h2>Output quality</h2>" in page and "outputs changed" in page
    assert "min_token_agreement &gt;= 95%" in page


def test_kv_cache_too_small_at_startup_is_oom_at_startup(sweep: Run) -> None:
    """Guards the classification of vLLM's start-up memory check: two KV blocks cannot hold
    one 512-token sequence, so vLLM stops the engine before ready; the trial is
    FAIL(oom_at_startup) naming vLLM's own numbers, with no start-up time."""
    row = sweep.sweep.store.read_trials().set_index("trial_number").loc[OOM]
    assert row["param_num_gpu_blocks_override"] == 2
    assert row["state"] == "FAIL", sweep.out[-3000:]
    assert row["fail_reason"] == "oom_at_startup", (row["fail_reason"], row["fail_detail"])
    assert "KV cache" in row["fail_detail"] and "512" in row["fail_detail"], row["fail_detail"]
    assert row["startup_s"] is None or pd.isna(row["startup_s"])


def test_engine_and_zygote_killed_mid_load_then_the_next_trial_starts_another(
        sweep: Run) -> None:
    """Guards a server that dies mid-load (its EngineCore, then the node's warm zygote, as by
    the OOM killer): trial 2 is FAIL(server_died) with its log tail and the rows measured so
    far; trial 3 finds the zygote dead, starts another, completes, still warm_start, and the
    new zygote ends with the sweep (its folder, and the dead one's, removed)."""
    kills = sweep.kills
    assert kills.error == "", (kills.error, sweep.out[-3000:])
    assert kills.engines, "no vLLM EngineCore process found below the zygote"
    assert kills.answered, "the server answered too few requests"
    assert kills.old is not None
    assert len(kills.new) == 1 and kills.new[0].pid != kills.old.pid, sweep.out[-3000:]
    assert "the zygote had died; starting another" in sweep.out, sweep.out[-3000:]
    trials = sweep.sweep.store.read_trials().set_index("trial_number")
    dead, second = trials.loc[KILLED], trials.loc[FP8]
    assert dead["state"] == "FAIL" and dead["fail_reason"] == "server_died", dead["fail_detail"]
    assert dead["log_tail"] and len(dead["log_tail"].splitlines()) <= 50
    assert second["state"] == "COMPLETE", second["fail_detail"]
    assert list(second["startup_levers"]) == ["warm_start"]
    n, ok = duckdb.sql(
        f"SELECT count(*), count(*) FILTER (WHERE success) FROM read_parquet("
        f"'{sweep.folder}/results/quality/requests/**/*.parquet', hive_partitioning=true) "
        f"WHERE trial_number = {KILLED}").fetchall()[0]
    assert n > 0 and 0 < ok < NUM_PROMPTS, (n, ok)
    kills.new[0].wait(timeout=30)  # it died with its keeper (psutil.TimeoutExpired if not)
    folders = kills.folders
    assert len(folders) == 2 and all(f.name.startswith(FOLDER_PREFIX) and not f.exists()
                                     for f in folders), folders


SUCCESS = "vllm:request_success_total"


def vllm_metrics_url(zygote: psutil.Process) -> str | None:
    """The /metrics URL of the vLLM API server forked by `zygote` (the fork that keeps the
    zygote's command line): the address it listens on whose /metrics page has vLLM's request
    counter. Only the API server's own sockets are tried: EngineCore's worker listens too
    (torch's TCPStore), and never answers HTTP."""
    listening = set()
    for p in zygote.children():
        try:
            if "framework.engine.zygote" in _line(p):
                listening |= {(_ipv4(c.laddr.ip), c.laddr.port)
                              for c in p.net_connections(kind="inet")
                              if c.status == psutil.CONN_LISTEN}
        except psutil.Error:
            continue
    for ip, port in sorted(listening):
        url = f"http://{ip}:{port}/metrics"
        try:
            if SUCCESS in get_sync(url, 5.0).text():
                return url
        except (OSError, ValueError):
            continue
    return None


def _ipv4(ip: str) -> str:
    """A listening address as a client reaches it: IPv4-mapped IPv6 unmapped, any -> loopback."""
    ip = ip.removeprefix("::ffff:")
    return "127.0.0.1" if ip in ("0.0.0.0", "::") else ip


def answered(url: str) -> float:
    """vLLM's request_success_total at the /metrics `url`, summed over its labels."""
    text = get_sync(url, 10.0).text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(SUCCESS))


def served(url: str, n: float, timeout_s: float) -> bool:
    """Wait until the server at the /metrics `url` has completed n requests; whether it got
    there in time (False at once if the server is gone)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if answered(url) >= n:
                return True
        except OSError:
            return False
        time.sleep(0.2)
    return False


def _line(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def _zygotes() -> list[psutil.Process]:
    """The zygotes below this process (its shared Ray's keeper actors' children), not their
    forks, which keep the zygote's command line. Found by descent, so another pytest lane's
    are not: setproctitle, which the zygote calls, hides its environment (and so the test
    marker) from /proc."""
    found = []
    for p in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if "framework.engine.zygote" in _line(p) and \
                    "framework.engine.zygote" not in _line(p.parent()):
                found.append(p)
        except psutil.Error:
            continue
    return found


def _folder(zygote: psutil.Process) -> Path:
    """The zygote's folder: its socket's (`python -m framework.engine.zygote SOCKET`)."""
    args = _line(zygote).split()
    return Path(args[args.index("framework.engine.zygote") + 1]).parent

