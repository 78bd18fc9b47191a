"""The runner's contract, against a launcher without Ray: every server is a FakeEngine process
on 127.0.0.1 (framework.engine.fake_engine), placed on a pretend cluster of N devices.

Contract: every asked trial is told exactly once and leaves one trial row and its request
rows; every server started is stopped exactly once, unless the next trial with equal vLLM
flags takes it over (prefix cache reset first); a launch failure is a FAIL row with its reason;
a trial that can never be placed is recorded without launching; no more devices are held at
once than the cluster has; a trial a dead driver left RUNNING is recorded FAIL(interrupted).
"""

from __future__ import annotations

import ast
import io
import os
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import pytest
import yaml
from rich.console import Console

from framework.base.errors import TrialError
from framework.engine import control
from framework.engine.startup_log import STARTUP_PHASE_COLUMNS
from framework.results.store import read_origin
from framework.results.verdict import decide
from framework.search.tuner import Evaluation
from framework.search.tuner import Proposal
from framework.search.tuner import Tuner
from framework.sweep.loader import load
from framework.sweep.runner import Runner
from tests.paths import ROOT
from tests.sweeps import NO_REMEASURE

HOST = "127.0.0.1"
SERVE = "import sys; from framework.engine.fake_engine import serve; serve(sys.argv[1:])"
# a device never freed fails the trial, not the test run; far longer than a queued trial
# waits for one here (3.5 s at most, measured with the CPU burned by two other processes)
PLACEMENT_TIMEOUT_S = 60.0
PHASES = [name for name, _ in STARTUP_PHASE_COLUMNS]
FAST = {"FAKE_ENGINE_STARTUP_S": "0.05", "FAKE_ENGINE_TTFT_MS": "1", "FAKE_ENGINE_TPOT_MS": "1"}


class FakeServer:
    """trial.ServerHandle: one FakeEngine process; counts its stops and control commands."""

    def __init__(self, argv: Sequence[str], port: int, log_path: Path, bundles: int,
                 devices: int, release: Callable[[int], None]) -> None:
        self.base_url, self.node_ip = f"http://{HOST}:{port}", HOST
        self.placement = (HOST,) * bundles
        self.argv, self.devices, self._release = tuple(argv), devices, release
        self.log_path = log_path
        self.socket = str(Path(tempfile.gettempdir()) / f"vst-{uuid.uuid4().hex[:12]}.sock")
        env = {**os.environ, **FAST, control.SOCKET_VAR: self.socket,
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-c", SERVE, *argv], env=env,
                                         stdout=log, stderr=subprocess.STDOUT)
        self.pid = self.proc.pid
        self.stops = 0
        self.commands: list[str] = []
        self._lock = threading.Lock()

    def is_alive(self) -> bool:
        return self.proc.poll() is None

    def failure(self) -> TrialError | None:
        code = self.proc.poll()
        return None if code is None else TrialError("startup_crash", f"fake engine exit {code}")

    def stop(self) -> list[int]:
        with self._lock:
            self.stops += 1
            first = self.stops == 1
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        Path(self.socket).unlink(missing_ok=True)  # a killed engine cannot remove it
        if first:
            self._release(self.devices)
        return []

    def command(self, name: str, timeout_s: float = 60.0) -> str:
        self.commands.append(name)
        return control.send(self.socket, name, timeout_s)

    def startup_log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def devices_held(self) -> str:
        return ""


class FakeLauncher:
    """runner.ClusterLauncher on one pretend node with `gpus` devices: a launch waits until
    its devices are free (as a placement group does), reports the trial placed, then starts a
    FakeEngine. `refuse` names a launch to fail: its argv -> the reason it fails, or None."""

    def __init__(self, gpus: int, refuse: Callable[[list[str]], str | None] = lambda _: None
                 ) -> None:
        self.gpus, self.refuse = gpus, refuse
        self.held = 0
        self.most_held = 0
        self.servers: list[FakeServer] = []
        self.refused: list[list[str]] = []
        self.avoided: list[frozenset[str]] = []  # each launch's `avoid`, in order
        self._cond = threading.Condition()
        self._stopped = False

    def node_resources(self) -> list[dict[str, float]]:
        return [{"CPU": 8.0, "GPU": float(self.gpus)}]

    def placeable_nodes(self) -> list[dict[str, float]]:
        return self.node_resources()

    def free_devices(self) -> float:
        with self._cond:
            return float(self.gpus - self.held)

    def _release(self, devices: int) -> None:
        with self._cond:
            self.held -= devices
            self._cond.notify_all()

    def launch(self, argv_for_port: Callable[[str, int], list[str]], log_path: Path,
               wanted: Sequence[dict[str, float]], on_placed: Callable[[], None] = lambda: None,
               unit: int = 1, avoid: frozenset[str] = frozenset()) -> FakeServer:
        self.avoided.append(avoid)  # one pretend node: nothing to avoid it for
        devices = int(sum(b.get("GPU", 0) for b in wanted))
        with self._cond:
            placed = self._cond.wait_for(
                lambda: self._stopped or self.gpus - self.held >= devices, PLACEMENT_TIMEOUT_S)
            if self._stopped or not placed:
                raise TrialError("unplaceable", "the launcher was stopped" if self._stopped
                                 else f"{devices} device(s) not free within {PLACEMENT_TIMEOUT_S} s")
            self.held += devices
            self.most_held = max(self.most_held, self.held)
        with socket.socket() as probe:
            probe.bind((HOST, 0))
            port = probe.getsockname()[1]
        argv = argv_for_port(HOST, port)
        reason = self.refuse(argv)
        if reason is not None:
            self._release(devices)
            self.refused.append(argv)
            on_placed()
            raise TrialError(reason, f"fake launcher refuses {' '.join(argv[2:-4])}")
        on_placed()  # as RayLauncher: placed, then the server starts (start-ahead waits here)
        server = FakeServer(argv, port, log_path, len(wanted), devices, self._release)
        with self._cond:
            self.servers.append(server)
        return server

    def stop_all(self) -> None:
        with self._cond:
            self._stopped = True
            servers = list(self.servers)
        for server in servers:
            server.stop()


def _tokenizer(folder: Path) -> None:
    """A word-level tokenizer (w0..w199): prompts of exact token counts, no model needed."""
    from tokenizers import Tokenizer
    from tokenizers import models
    from tokenizers import pre_tokenizers

    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(200)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["[UNK]"])
    tok.save(str(folder / "tokenizer.json"))


def _sweep(tmp: Path, name: str, parameters: dict, reuse: bool, n_trials: int,
           search: dict | None = None) -> Path:
    model = tmp / "model"
    if not model.is_dir():
        model.mkdir()
        (model / "config.json").write_text("{}")
        _tokenizer(model)
    space = tmp / f"{name}-space.yaml"
    space.write_text(yaml.safe_dump({"parameters": parameters}))
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name, "model": str(model), "search_space": str(space), "engine": "fake",
        "server": {"reuse": reuse, "startup_timeout_s": 30},
        "workload": {"num_prompts": 8, "input_len": 8, "output_len": 4, "warmup_requests": 2,
                     "max_concurrency": 4},
        "search": {**NO_REMEASURE, "sampler": "grid", "n_trials": n_trials, "baseline": False,
                   "seed": 1, **(search or {})},
        # run settings are searched here to test server reuse, not to rank loads
        "objective": {"allow_load_bound": True},
        "results_dir": str(tmp / "results")}))
    return path


class Counted:
    """The runner's Tuner with its asks and tells counted by trial number; an ask for which
    `interrupt()` holds raises KeyboardInterrupt instead (Ctrl-C in the main thread)."""

    def __init__(self, tuner: Tuner, interrupt: Callable[[], bool] = lambda: False) -> None:
        self.asked: list[int] = []
        self.told: list[int] = []
        ask, tell = tuner.ask, tuner.tell

        def counted_ask() -> Proposal:
            if interrupt():
                raise KeyboardInterrupt
            p = ask()
            self.asked.append(p.number)
            return p

        def counted_tell(p: Proposal, ev: Evaluation) -> None:
            self.told.append(p.number)
            tell(p, ev)

        tuner.ask, tuner.tell = counted_ask, counted_tell  # type: ignore[method-assign]


def _run(path: Path, launcher: FakeLauncher, target: int) -> tuple[Runner, Counted, str]:
    out = io.StringIO()
    runner = Runner(load(path), launcher, Console(file=out, width=200))
    counted = Counted(runner.tuner)
    runner.run(target)
    return runner, counted, out.getvalue()


def _told_once_with_rows(runner: Runner, counted: Counted, n: int):
    assert sorted(counted.asked) == list(range(n))
    assert sorted(counted.told) == sorted(counted.asked), "each asked trial told exactly once"
    assert runner.tuner.finished() == n
    trials = runner.store.read_trials()
    assert list(trials["trial_number"]) == list(range(n))
    for number in range(n):
        assert runner.store.requests_path(number).is_file()
    assert read_origin(runner.store.sweep_dir) == (runner.sweep.path.resolve(), Path.cwd())
    return trials


@pytest.mark.timeout(120)
def test_reuse_hands_the_server_to_the_next_trial_with_equal_flags(tmp_path):
    """Grid walk grouped by vLLM flags on one device: each server serves both run settings;
    a refused launch is a FAIL row with its reason and starts no server."""
    space = {"max-num-seqs": {"type": "categorical", "choices": [3, 4, 8]},
             "max-concurrency": {"type": "categorical", "choices": [2, 4], "kind": "run"}}
    launcher = FakeLauncher(gpus=1, refuse=lambda argv: "startup_crash"
                            if argv[argv.index("--max-num-seqs") + 1] == "3" else None)
    runner, counted, out = _run(_sweep(tmp_path, "reuse", space, True, 6), launcher, 6)
    trials = _told_once_with_rows(runner, counted, 6)

    failed = trials[trials["param_max_num_seqs"] == 3]
    assert list(failed["state"]) == ["FAIL", "FAIL"] and len(launcher.refused) == 2
    assert set(failed["fail_reason"]) == {"startup_crash"}
    assert all("fake launcher refuses" in d for d in failed["fail_detail"])
    assert failed["server_pid"].isna().all()

    by_seqs = {int(s.argv[s.argv.index("--max-num-seqs") + 1]): s for s in launcher.servers}
    assert sorted(by_seqs) == [4, 8] and len(launcher.servers) == 2, out
    for seqs, server in by_seqs.items():
        pair = trials[trials["param_max_num_seqs"] == seqs]
        assert list(pair["state"]) == ["COMPLETE", "COMPLETE"], pair[["fail_reason", "fail_detail"]]
        assert list(pair["server_reused"]) == [False, True]
        assert set(pair["server_pid"]) == {server.pid}
        assert pair["param_max_concurrency"].nunique() == 2
        assert pair["serve_command"].nunique() == 1 and pair["server_log"].nunique() == 1
        assert server.commands == ["reset_prefix_cache"]
        assert (pair["prefix_cache_hit_rate"] == 0).all()  # same prompts: only a reset shows none
        # start-up phases: FakeEngine logs none of vLLM's lines, so placement + api (the rest)
        # make the fresh server's startup_s; a reused server has none
        fresh, reused = pair.iloc[0], pair.iloc[1]
        assert fresh["startup_placement_s"] + fresh["startup_api_s"] == pytest.approx(
            fresh["startup_s"])
        assert pd.isna(fresh["startup_weights_s"]) and fresh["startup_api_s"] > 0
        assert all(pd.isna(reused[c]) for c in PHASES)
    assert [s.stops for s in launcher.servers] == [1, 1]
    assert launcher.most_held <= 1 and launcher.held == 0
    assert "reusing the running server" in out


@pytest.mark.timeout(120)
def test_without_reuse_every_server_is_stopped_once_and_devices_are_never_oversubscribed(
        tmp_path):
    """Two devices, shapes TP 1, 2 and 4: TP 4 can never be placed and is recorded without a
    launch; the others run side by side as devices allow, each on its own server."""
    space = {"tensor-parallel-size": {"type": "categorical", "choices": [1, 2, 4]},
             "max-num-seqs": {"type": "categorical", "choices": [4, 8]}}
    launcher = FakeLauncher(gpus=2)
    runner, counted, out = _run(_sweep(tmp_path, "noreuse", space, False, 6), launcher, 6)
    trials = _told_once_with_rows(runner, counted, 6)

    unplaceable = trials[trials["param_tensor_parallel_size"] == 4]
    assert set(unplaceable["fail_reason"]) == {"unplaceable"}
    assert (unplaceable["vllm_argv"].map(len) == 0).all()
    measured = trials[trials["param_tensor_parallel_size"] != 4]
    assert (measured["state"] == "COMPLETE").all(), measured[["fail_reason", "fail_detail"]]
    assert not measured["server_reused"].any()
    assert sorted(measured["server_pid"]) == sorted(s.pid for s in launcher.servers)
    assert len(launcher.servers) == 4 and all(s.stops == 1 for s in launcher.servers), out
    assert all(not s.is_alive() for s in launcher.servers)
    assert launcher.most_held <= 2 and launcher.held == 0


@pytest.mark.timeout(120)
def test_the_baseline_brackets_the_search_and_the_winner_is_confirmed_on_a_fresh_server(tmp_path):
    """baseline_repeats 2, confirm_top 1, precision, on the grid: the baseline runs first,
    again once half the search started, and last, after the top configuration's confirmation;
    every grid point still runs (the grid's re-measurement comes on top of n_trials: it once
    took a grid point's place); re-measurements never reuse a server; every measured row has
    its precision columns; the verdict rests on the 3 baseline servers and on the winner's
    confirmation."""
    space = {"max-num-seqs": {"type": "categorical", "choices": [2, 4, 8], "default": 8}}
    search = {"baseline": True, "baseline_repeats": 2, "confirm_top": 1, "precision": 0.5,
              "precision_max_runs": 3}
    runner, counted, out = _run(_sweep(tmp_path, "remeasure", space, True, 4, search),
                                FakeLauncher(gpus=1), 4)
    trials = _told_once_with_rows(runner, counted, 7)
    base = trials[trials["is_baseline"] == True]  # noqa: E712
    assert list(base["trial_number"]) == [0, 3, 6]
    assert list(base["confirmation_of"].fillna(-1).astype(int)) == [-1, 0, 0]
    confirm = trials[trials["trial_number"] == 5].iloc[0]
    search_rows = trials[(trials["is_baseline"] != True) & trials["confirmation_of"].isna()]  # noqa: E712
    assert sorted(search_rows["param_max_num_seqs"]) == [2, 4, 8]  # the whole grid
    assert int(confirm["confirmation_of"]) in set(search_rows["trial_number"])
    remeasured = trials[trials["confirmation_of"].notna()]
    assert not remeasured["server_reused"].any()
    done = trials[trials["state"] == "COMPLETE"]
    assert (done["precision_target"] == 0.5).all() and done["precision_stop"].notna().all()
    assert done["repeats"].between(1, 3).all()
    verdict = decide(trials, "output_throughput", True, {})
    assert verdict.baseline is not None and verdict.baseline.servers == 3
    assert verdict.estimate is not None and verdict.estimate.servers == 1  # the confirmation


@pytest.mark.timeout(120)
class StopFailsLauncher(FakeLauncher):
    """FakeLauncher whose stop_all, once every server is stopped, raises as RayLauncher's
    does when a stop failed (e.g. a log append's OSError)."""

    def stop_all(self) -> None:
        super().stop_all()
        raise OSError("No space left on device: trial-00001.log")


@pytest.mark.parametrize("launcher_class", [FakeLauncher, StopFailsLauncher])
def test_an_interrupt_stops_every_server_and_records_the_trials_in_flight(tmp_path,
                                                                          launcher_class):
    """Ctrl-C at the first ask after a server started (the launcher reports a trial placed
    once its server runs, so at the latest at the fourth ask: ask_another keeps 3 waiting).
    A failed stop is reported and the trials in flight are still recorded (#33 item 9)."""
    space = {"tensor-parallel-size": {"type": "categorical", "choices": [1, 2]},
             "max-num-seqs": {"type": "categorical", "choices": [4, 8]},
             "max-num-batched-tokens": {"type": "categorical", "choices": [256, 512]}}
    launcher = launcher_class(gpus=2)
    out = io.StringIO()
    runner = Runner(load(_sweep(tmp_path, "stopped", space, False, 8)), launcher,
                    Console(file=out, width=200))
    counted = Counted(runner.tuner, interrupt=lambda: bool(launcher.servers))
    with pytest.raises(KeyboardInterrupt):
        runner.run(8)
    trials = _told_once_with_rows(runner, counted, len(counted.asked))
    for _, row in trials.iterrows():
        assert row["state"] == "COMPLETE" or row["fail_reason"] == "interrupted", dict(row)
    assert launcher.servers and all(s.stops >= 1 and not s.is_alive() for s in launcher.servers)
    assert launcher.held == 0
    failed = "stopping the servers: OSError: No space left on device" in out.getvalue()
    assert failed is (launcher_class is StopFailsLauncher)


def test_a_trial_a_dead_driver_left_running_is_recorded_as_interrupted(tmp_path):
    space = {"max-num-seqs": {"type": "categorical", "choices": [4, 8]}}
    sweep = load(_sweep(tmp_path, "dead", space, False, 2))
    runner = Runner(sweep, FakeLauncher(gpus=1), Console(file=io.StringIO()))
    other = Tuner(runner.store.journal_path, "dead", sweep.space, ["maximize"], "grid", 1, 2)
    left = other.ask()  # the dead driver's trial: asked, never told
    runner.recover()
    row = runner.store.read_trials().iloc[0]
    assert row["trial_number"] == left.number and row["state"] == "FAIL"
    assert row["fail_reason"] == "interrupted"
    assert row["param_max_num_seqs"] == left.params["max-num-seqs"]
    assert runner.tuner.configuration(left.number).params == left.params


class KilledAtTell(BaseException):
    """The driver killed between a trial's rows and its tell (as kill -9 there would)."""


@pytest.mark.timeout(120)
def test_a_trial_recorded_but_not_told_by_a_dead_driver_keeps_its_row_on_resume(tmp_path):
    """Guards s14e's race: kill -9 after `_record` wrote trial 0's rows and before it told the
    study left it RUNNING; the resume recorded FAIL(interrupted) over the measured row. Now the
    resume tells the study what the dead driver stored, keeps the row, and goes on."""
    space = {"max-num-seqs": {"type": "categorical", "choices": [4, 8]}}
    path = _sweep(tmp_path, "killed", space, False, 2)
    dead = Runner(load(path), FakeLauncher(gpus=1), Console(file=io.StringIO()))

    def killed(p: Proposal, ev: Evaluation) -> None:
        raise KilledAtTell

    dead.tuner.tell = killed  # type: ignore[method-assign]
    with pytest.raises(KilledAtTell):
        dead.run(1)  # one trial: none other in flight for the interrupt handler to record
    measured = dead.store.read_trials()
    assert list(measured["state"]) == ["COMPLETE"]

    runner, counted, out = _run(path, FakeLauncher(gpus=1), 2)
    assert "trial 0 was recorded by an earlier run that stopped before telling the study" in out
    assert "interrupted" not in out
    trials = runner.store.read_trials()
    assert list(trials["trial_number"]) == [0, 1] and list(trials["state"]) == ["COMPLETE"] * 2
    assert trials.iloc[0]["objective"] == measured.iloc[0]["objective"]  # the row kept
    study = runner.tuner.study.trials
    assert study[0].state.name == "COMPLETE" and study[0].values == [measured.iloc[0]["objective"]]
    assert counted.asked == [1]  # trial 0 is not run again


@pytest.mark.parametrize("module", ["runner", "server_pool", "trial_plan"])
def test_the_sweep_loop_imports_neither_optuna_nor_pandas(module):
    tree = ast.parse((ROOT / "framework" / "sweep" / f"{module}.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom)}
    assert not imported & {"optuna", "pandas", "pyarrow", "ray"}


@pytest.mark.timeout(120)
def test_when_the_confirmed_configuration_breaks_on_its_fresh_server_the_next_is_confirmed(tmp_path):
    """confirm_top 1, no baseline: the best configuration's confirmation fails (its second
    launch is refused), so remeasure.queue_more_confirmations confirms the next best; a third
    round never comes (CONFIRM_ROUNDS 2), and the verdict names the configuration that held."""
    best_flag: list[str] = []  # set once the search's 3 trials are told
    launches_of_best: list[list[str]] = []

    def refuse_second_launch_of_the_best(argv: list[str]) -> str | None:
        if not best_flag or best_flag[0] not in " ".join(argv):
            return None
        launches_of_best.append(argv)
        return "server_died" if len(launches_of_best) == 1 else None  # its confirmation

    space = {"max-num-seqs": {"type": "categorical", "choices": [2, 4, 8]}}
    path = _sweep(tmp_path, "reconfirm", space, False, 3, {"confirm_top": 1})
    runner = Runner(load(path), FakeLauncher(gpus=1, refuse=refuse_second_launch_of_the_best),
                    Console(file=io.StringIO(), width=200))
    original_tell = runner.tuner.tell

    def tell_and_note_the_best(p, ev):
        original_tell(p, ev)
        trials = runner.store.read_trials()
        if len(trials) == 3 and not best_flag:  # the search is done: its best is known
            top = trials.sort_values("objective", ascending=False).iloc[0]
            best_flag.append(f"--max-num-seqs {int(top['param_max_num_seqs'])}")
    runner.tuner.tell = tell_and_note_the_best  # type: ignore[method-assign]
    runner.run(3)
    trials = runner.store.read_trials()
    confirms = trials[trials["confirmation_of"].notna()].sort_values("trial_number")
    assert len(confirms) == 2, trials[["trial_number", "confirmation_of", "state"]]
    first, second = confirms.iloc[0], confirms.iloc[1]
    assert first["state"] == "FAIL" and second["state"] == "COMPLETE"
    assert int(first["confirmation_of"]) != int(second["confirmation_of"])
    verdict = decide(trials, "output_throughput", True, {})
    assert verdict.number == int(second["confirmation_of"])
