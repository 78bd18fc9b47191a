#!/usr/bin/env python3
"""The device and fork facts vllm-sweep relies on, measured on this node's GPUs (#32).

    python tests/gpu/gpu_facts.py [--json] [--devices all|0,1,...] [--budget-s 270]

Needs torch (a CUDA build) and nothing else: no vLLM, no Ray, no network; under 5 minutes on one
H100/H200 (each further GPU adds one context probe, a few seconds). Run it on an idle GPU node:
the memory checks read the device's free memory from a second process (torch.cuda.mem_get_info),
so another process allocating meanwhile skews them. Each check prints one line,
`PASS|FAIL <name>: <measured> | expected: <what the project assumes> | relied on by: <file>`,
then a summary; `--json` prints one JSON document instead. Exit 0: every check passed;
1: some FAIL; 2: refused (no CUDA GPU, or no CUDA build of torch), with one line on stderr.

The checks, and the project code that relies on each (README, "First time on a GPU cluster",
says what to do with a FAIL):
  fork_nvml_only     a process that imported torch and used NVML only (device_count and
                     is_available with PYTORCH_NVML_BASED_CUDA_CHECK=1, what `import vllm` sets)
                     has not initialised CUDA, and its fork can: engine/zygote.py (warm_start).
  fork_is_available  is_available() without that variable runs cuInit, and a fork then cannot use
                     CUDA: why engine/zygote.py puts the variable back in every fork
                     (FORCED_BY_IMPORT, fork_env; #32 defect 4).
  fork_device_query  a torch device query (get_device_capability) initialises CUDA, and a fork then
                     cannot use CUDA: why nothing the zygote imports (PRELOAD) may query a device
                     through torch (vLLM's own queries go through NVML, NvmlCudaPlatform).
  fork_cvd           CUDA_VISIBLE_DEVICES set in a fork before CUDA is initialised is honoured: the
                     child computes on exactly that GPU, and on none for an index that does not
                     exist: cluster/launcher.py (at world size 1 the server actor holds its bundle's
                     GPU through the CUDA_VISIBLE_DEVICES Ray sets) with engine/zygote.py (the API
                     server fork takes the actor's environment after the fork).
  release_zombie     a SIGKILLed holder's device memory is free while it is a zombie, before its
                     parent reaps it: cluster/server.py `_running` and cluster/node_reap.py
                     `_running` count zombies as gone when a trial's GPUs are released.
  context[cuda:N]    the CUDA context one process pays on device N against memory_model.py's
                     CUDA_CONTEXT_BYTES (engine/feasibility.py's start-up headroom check).
  cublas[cuda:N]     what the first bf16 GEMM adds: cuBLAS's handles and kernels outside torch's
                     allocator plus the cuBLAS workspaces inside it, against memory_model.py's
                     NON_TORCH_BYTES_TP1 (non_torch_bytes at TP 1).
  gpu_table[cuda:N]  the device's total memory (cudaMemGetInfo) against memory_model.py's GPUS.

Every measurement runs in a fresh interpreter started by this one (`--role`), which itself never
initialises CUDA: the fork checks each start from a clean process.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
GIB = 2**30
MIB = 2**20
NVML_VAR = "PYTORCH_NVML_BASED_CUDA_CHECK"
# What this script reads from framework/engine/memory_model.py (tests/unit/test_gpu_facts.py
# checks that they exist).
MODEL_CONSTANTS = ("CUDA_CONTEXT_BYTES", "NON_TORCH_BYTES_TP1", "GPUS")
# How far a measured CUDA context may sit from CUDA_CONTEXT_BYTES and still pass: the larger of
# these (the constant is itself one published measurement, vLLM's "cuda_memory=0.51GiB").
CONTEXT_TOLERANCE_BYTES = 64 * MIB
CONTEXT_TOLERANCE_SHARE = 0.15
# How far cudaMemGetInfo's total may sit from the GPUS entry (it varies ~0.1 GiB by driver).
TOTAL_TOLERANCE_BYTES = 0.25 * GIB
HOLD_BYTES = 4 * GIB  # what the release check's holder allocates (at most a quarter of free)
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_NO_DEVICE = 100

ZYGOTE = "framework/engine/zygote.py"
RELIES = {
    "fork_nvml_only": f"{ZYGOTE} (warm_start: the zygote imports torch and vLLM, then forks the "
                      "API server, EngineCore and workers)",
    "fork_is_available": f"{ZYGOTE} FORCED_BY_IMPORT / fork_env (PYTORCH_NVML_BASED_CUDA_CHECK=1 "
                         "put back in every fork; #32 defect 4)",
    "fork_device_query": f"{ZYGOTE} PRELOAD (nothing the zygote imports may query a device "
                         "through torch)",
    "fork_cvd": "framework/cluster/launcher.py (world size 1: the actor holds its bundle's GPU via "
                f"Ray's CUDA_VISIBLE_DEVICES) + {ZYGOTE} (the API server fork takes that env)",
    "release_zombie": "framework/cluster/server.py _running + framework/cluster/node_reap.py "
                      "_running (zombies hold no device: the trial's GPUs are released)",
    "context": "framework/engine/memory_model.py CUDA_CONTEXT_BYTES (engine/feasibility.py "
               "start-up headroom)",
    "cublas": "framework/engine/memory_model.py NON_TORCH_BYTES_TP1 (non_torch_bytes at TP 1)",
    "gpu_table": "framework/engine/memory_model.py GPUS (the device's total memory)",
}


@dataclass
class Check:
    name: str
    ok: bool
    measured: str
    expected: str
    relied_on_by: str
    values: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        return (f"{'PASS' if self.ok else 'FAIL'} {self.name}: {self.measured} | expected: "
                f"{self.expected} | relied on by: {self.relied_on_by}")


def gib(n: float | None) -> str:
    return "?" if n is None else f"{n / GIB:.3f} GiB"


def mib(n: float | None) -> str:
    return "?" if n is None else f"{n / MIB:.0f} MiB"


# ---- the CUDA driver, read without initialising it --------------------------------------------

def _libcuda() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def driver_initialized() -> bool | None:
    """Whether this process has run cuInit: cuDeviceGetCount answers CUDA_ERROR_NOT_INITIALIZED
    before it and never initialises anything itself. None: no libcuda."""
    lib = _libcuda()
    if lib is None:
        return None
    n = ctypes.c_int(-1)
    return lib.cuDeviceGetCount(ctypes.byref(n)) != CUDA_ERROR_NOT_INITIALIZED


def driver_probe() -> dict[str, Any]:
    """cuInit, the device count and a primary context on device 0, straight from the driver
    (torch's own guard against forks aside): the return codes."""
    lib = _libcuda()
    if lib is None:
        return {"libcuda": False}
    out: dict[str, Any] = {"cuInit": lib.cuInit(0)}
    n = ctypes.c_int(-1)
    out["cuDeviceGetCount"] = lib.cuDeviceGetCount(ctypes.byref(n))
    out["count"] = n.value
    if out["cuInit"] == 0 and n.value > 0:
        dev = ctypes.c_int(-1)
        lib.cuDeviceGet(ctypes.byref(dev), 0)
        ctx = ctypes.c_void_p()
        out["cuDevicePrimaryCtxRetain"] = lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    return out


def proc_state(pid: int) -> str:
    """The state letter of /proc/<pid>/stat (R, S, D, Z, ...); 'gone' once reaped."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


# ---- roles: what each fresh interpreter does ---------------------------------------------------

def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


def child_cuda(cvd: str | None) -> dict[str, Any]:
    """In a fork: set CUDA_VISIBLE_DEVICES (None: leave it), then use CUDA through torch."""
    if cvd is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = cvd
    import torch

    out: dict[str, Any] = {"cvd": os.environ.get("CUDA_VISIBLE_DEVICES")}
    bad_fork = getattr(torch.cuda, "_is_in_bad_fork", None)
    out["torch_bad_fork"] = bool(bad_fork()) if bad_fork else None
    try:
        t = torch.ones(1 << 20, device="cuda")
        out["ok"] = float(t.sum().item()) == float(1 << 20)
        out["count"] = torch.cuda.device_count()
        out["uuid"] = str(torch.cuda.get_device_properties(0).uuid)
    except Exception as e:  # noqa: BLE001 - what fails is the measurement
        out["ok"] = False
        out["error"] = _first_line(e)
        try:  # cudaGetDeviceCount as torch reads it (0 on any error)
            out["count"] = int(torch._C._cuda_getDeviceCount())
        except Exception as e2:  # noqa: BLE001
            out["count_error"] = _first_line(e2)
    out["driver"] = driver_probe()
    return out


def fork_run(fn, arg: str | None, timeout_s: float) -> dict[str, Any]:
    """fn(arg) in a fork of this process; its JSON answer over a pipe."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            try:
                out = fn(arg)
            except BaseException as e:  # noqa: BLE001 - reported, the fork must exit here
                out = {"ok": False, "error": _first_line(e)}
            data = json.dumps(out).encode()
            while data:
                data = data[os.write(w, data):]
        finally:
            os._exit(0)
    os.close(w)
    data, deadline = b"", time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([r], [], [], left)[0]:
            os.kill(pid, signal.SIGKILL)
            data = b""
            break
        chunk = os.read(r, 65536)
        if not chunk:
            break
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if not data:
        return {"ok": False, "error": f"the fork gave no answer in {timeout_s:.0f} s "
                                      f"(wait status {status})"}
    return json.loads(data)


def role_fork_parent(mode: str, child_timeout_s: float) -> dict[str, Any]:
    """Import torch, do `mode`'s CUDA call, fork children that use CUDA, then read whether this
    process had initialised CUDA (after the forks: the probe loads libcuda)."""
    os.environ.pop(NVML_VAR, None)
    if mode != "is_available":
        os.environ[NVML_VAR] = "1"  # what `import vllm` sets (vllm/env_override.py)
    import torch

    out: dict[str, Any] = {"mode": mode, NVML_VAR: os.environ.get(NVML_VAR)}
    if mode in ("nvml_only", "cvd"):
        out["device_count"] = torch.cuda.device_count()
        out["is_available"] = torch.cuda.is_available()
    elif mode == "is_available":
        out["is_available"] = torch.cuda.is_available()
    elif mode == "device_query":
        out["capability"] = list(torch.cuda.get_device_capability(0))
    if mode == "cvd":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        entries = ([e.strip() for e in visible.split(",") if e.strip()] if visible
                   else [str(i) for i in range(out["device_count"])])
        out["target_index"] = len(entries) - 1
        out["child_target"] = fork_run(child_cuda, entries[-1], child_timeout_s)
        out["child_absent"] = fork_run(child_cuda, "99", child_timeout_s)
    else:
        out["child"] = fork_run(child_cuda, None, child_timeout_s)
    out["parent_cuinit"] = driver_initialized()
    out["parent_torch_initialized"] = torch.cuda.is_initialized()
    if mode == "cvd":  # the forks are done: this process may use CUDA now
        out["uuids"] = [str(torch.cuda.get_device_properties(i).uuid)
                        for i in range(torch.cuda.device_count())]
    return out


def role_observer() -> None:
    """Answer each stdin line `N` with `free total` of device N (torch.cuda.mem_get_info)."""
    import torch

    for line in sys.stdin:
        free, total = torch.cuda.mem_get_info(int(line))
        print(free, total, flush=True)


def role_holder(nbytes: int) -> None:
    """Hold `nbytes` on cuda:0, say so, wait to be killed."""
    import torch

    x = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    x.fill_(1)
    torch.cuda.synchronize()
    print("ready", flush=True)
    time.sleep(3600)


def _step(step: str, /, **values: Any) -> None:
    """Print one step's line (`values` may hold a `name`: the device's), wait for the driver."""
    print(json.dumps({"step": step, **values}), flush=True)
    sys.stdin.readline()  # the driver has read the device's free memory


def role_probe() -> None:
    """Context, then a bf16 GEMM, then the cuBLAS workspaces: a pause after each step for the
    driver to read the device's free memory from the observer."""
    import torch

    _step("imported", module_loading=os.environ.get("CUDA_MODULE_LOADING"))
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    props = torch.cuda.get_device_properties(0)
    _step("context", reserved=torch.cuda.memory_reserved(), name=props.name,
          uuid=str(props.uuid), total=torch.cuda.mem_get_info()[1],
          module_loading=os.environ.get("CUDA_MODULE_LOADING"))
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    _step("tensors", reserved=torch.cuda.memory_reserved())
    b = a @ a
    torch.cuda.synchronize()
    _step("gemm", reserved=torch.cuda.memory_reserved())
    del a, b
    torch.cuda.empty_cache()
    with_ws = torch.cuda.memory_reserved()
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
        torch.cuda.empty_cache()
    _step("workspace", reserved_with=with_ws, reserved_without=torch.cuda.memory_reserved(),
          cleared=clear is not None)


# ---- the driver's side -------------------------------------------------------------------------

class Proc:
    """A role in a fresh interpreter, read line by line with a timeout."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.popen = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *args],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, env=env, bufsize=0)
        self._buf = b""

    def readline(self, timeout_s: float) -> str | None:
        """The next line; None at EOF or after timeout_s."""
        assert self.popen.stdout is not None
        fd = self.popen.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    def send(self, text: str) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(text.encode() + b"\n")
        self.popen.stdin.flush()

    def stderr_tail(self, wait_s: float = 10.0) -> str:
        """The last line of its stderr once it has exited (a process whose stdout closed may
        take a moment to exit: wait up to wait_s); if it still runs, say so."""
        if self.popen.stderr is None:
            return ""
        try:
            code = self.popen.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return f"still running {wait_s:.0f} s later, no line"
        lines = self.popen.stderr.read().decode(errors="replace").strip().splitlines()
        return f"exit {code}: " + (lines[-1][:300] if lines else "no stderr")

    def end(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()
        for stream in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
            if stream is not None:
                stream.close()


class Observer(Proc):
    def __init__(self, env: dict[str, str]) -> None:
        super().__init__(["--role", "observer"], env)

    def free(self, device: int, timeout_s: float = 60.0) -> int:
        self.send(str(device))
        line = self.readline(timeout_s)
        if line is None:
            raise RuntimeError(f"the observer process gave no answer ({self.stderr_tail()})")
        return int(line.split()[0])


class Budget:
    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self, cap: float) -> float:
        return max(0.0, min(cap, self.deadline - time.monotonic()))


def base_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop(NVML_VAR, None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_fork_parent(mode: str, budget: Budget) -> dict[str, Any]:
    timeout = budget.left(120.0)
    if timeout <= 0:
        return {"error": "not run: the time budget was spent"}
    try:
        p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--role",
                            "fork-parent", mode, "--child-timeout-s", str(min(30.0, timeout))],
                           capture_output=True, text=True, env=base_env(), timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = p.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (p.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return {"error": f"exit {p.returncode}: {tail}"}


def _child_text(c: dict[str, Any]) -> str:
    if c.get("ok"):
        return "child used CUDA"
    d = c.get("driver", {})
    return (f"child could not use CUDA ({c.get('error', '?')}; torch bad-fork flag "
            f"{c.get('torch_bad_fork')}; driver cuInit={d.get('cuInit')} "
            f"ctx={d.get('cuDevicePrimaryCtxRetain')})")


def sees_none(child: dict[str, Any]) -> bool:
    """A fork that found no GPU: torch counted 0, or the driver did (cuInit answering
    CUDA_ERROR_NO_DEVICE when CUDA_VISIBLE_DEVICES names none)."""
    d = child.get("driver", {})
    return (child.get("count") == 0 or d.get("count") == 0
            or d.get("cuInit") == CUDA_ERROR_NO_DEVICE)


def _parent_text(r: dict[str, Any]) -> str:
    init = r.get("parent_cuinit")
    return f"parent cuInit: {'unknown' if init is None else 'yes' if init else 'no'}"


def fork_checks(budget: Budget) -> list[Check]:
    checks = []
    r = run_fork_parent("nvml_only", budget)
    child = r.get("child", {})
    ok = "error" not in r and r.get("parent_cuinit") is False and bool(child.get("ok"))
    checks.append(Check(
        "fork_nvml_only",
        ok, r.get("error") or f"{_parent_text(r)}, device_count={r.get('device_count')}; "
                              f"{_child_text(child)}",
        f"{NVML_VAR}=1, device_count() + is_available(): parent cuInit no, child uses CUDA",
        RELIES["fork_nvml_only"], r))

    for mode, name, call in (("is_available", "fork_is_available",
                              f"is_available() without {NVML_VAR}"),
                             ("device_query", "fork_device_query",
                              f"get_device_capability(0) with {NVML_VAR}=1")):
        r = run_fork_parent(mode, budget)
        child = r.get("child", {})
        ok = "error" not in r and r.get("parent_cuinit") is True and child.get("ok") is False
        checks.append(Check(
            name, ok, r.get("error") or f"{_parent_text(r)}; {_child_text(child)}",
            f"{call}: parent cuInit yes, child cannot use CUDA", RELIES[name], r))

    r = run_fork_parent("cvd", budget)
    target, absent = r.get("child_target", {}), r.get("child_absent", {})
    uuids, index = r.get("uuids") or [], r.get("target_index")
    want = uuids[index] if isinstance(index, int) and 0 <= index < len(uuids) else None
    got = target.get("uuid")
    ok = ("error" not in r and bool(target.get("ok")) and target.get("count") == 1
          and want is not None and got == want and not absent.get("ok")
          and sees_none(absent))
    measured = r.get("error") or (
        f"CUDA_VISIBLE_DEVICES={target.get('cvd')}: child saw {target.get('count')} GPU "
        f"{'= ' if got == want else '!= '}the parent's cuda:{index} ({got} vs {want})"
        f"{'' if target.get('ok') else ' ' + _child_text(target)}; "
        f"CUDA_VISIBLE_DEVICES=99: child saw {'no' if sees_none(absent) else 'some'} GPU "
        f"(torch count {absent.get('count')}, driver {absent.get('driver')})"
        f"{' and still used CUDA' if absent.get('ok') else ''}")
    checks.append(Check(
        "fork_cvd", ok, measured,
        "a fork setting CUDA_VISIBLE_DEVICES=<one GPU> before CUDA init computes on that GPU "
        "alone; =99 sees none", RELIES["fork_cvd"], r))
    return checks


def release_check(budget: Budget) -> Check:
    """A holder (a child of this process) takes memory on cuda:0; SIGKILL it and, without
    reaping it, watch the observer's free memory; if it never comes back, reap and watch again."""
    expected = "freed while the SIGKILLed holder is an unreaped zombie (no wait needed)"
    values: dict[str, Any] = {}
    obs = holder = None
    try:
        obs = Observer(base_env())
        obs.free(0, budget.left(90.0))
        free0 = obs.free(0)
        want = int(min(HOLD_BYTES, free0 // 4))
        holder = Proc(["--role", "holder", str(want)], base_env())
        if holder.readline(budget.left(120.0)) != "ready":
            raise RuntimeError(f"the holder never held its memory ({holder.stderr_tail()})")
        held_free = obs.free(0)
        held = free0 - held_free
        values.update(free_before=free0, held=held, asked=want)
        if held < want // 2:
            raise RuntimeError(f"the observer saw {gib(held)} taken of the {gib(want)} held: "
                               "another process is changing this GPU's memory")
        pid = holder.popen.pid
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        zombie_s = freed_s = None
        state = "?"
        while time.monotonic() - t0 < min(20.0, budget.left(20.0)):
            if zombie_s is None and proc_state(pid) == "Z":
                zombie_s = time.monotonic() - t0
            if obs.free(0) - held_free >= 0.9 * held:
                freed_s = time.monotonic() - t0
                state = proc_state(pid)  # never reaped here: Z if it had exited
                break
            time.sleep(0.005)
        values.update(zombie_after_s=zombie_s, freed_after_s=freed_s,
                      state_when_freed=state)
        if freed_s is not None:
            holder.popen.wait()
            measured = (f"{gib(held)} held, free again {freed_s * 1000:.0f} ms after SIGKILL, "
                        f"holder state then {state} (zombie after "
                        f"{'?' if zombie_s is None else f'{zombie_s * 1000:.0f} ms'}), "
                        f"not reaped")
            return Check("release_zombie", True, measured, expected, RELIES["release_zombie"],
                         values)
        state = proc_state(pid)
        holder.popen.wait()
        t1 = time.monotonic()
        after_reap = None
        while time.monotonic() - t1 < min(10.0, budget.left(10.0)):
            if obs.free(0) - held_free >= 0.9 * held:
                after_reap = time.monotonic() - t1
                break
            time.sleep(0.01)
        values.update(state_before_reap=state, freed_after_reap_s=after_reap)
        measured = (f"{gib(held)} held, NOT free 20 s after SIGKILL while the holder was "
                    f"{state} (unreaped); "
                    + (f"free {after_reap * 1000:.0f} ms after it was reaped" if after_reap
                       is not None else "still not free 10 s after it was reaped"))
        return Check("release_zombie", False, measured, expected, RELIES["release_zombie"],
                     values)
    except (RuntimeError, OSError, ValueError) as e:
        return Check("release_zombie", False, f"not measured: {_first_line(e)}", expected,
                     RELIES["release_zombie"], values)
    finally:
        for p in (holder, obs):
            if p is not None:
                p.end()


def visible_entries(count: int) -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return [e.strip() for e in visible.split(",") if e.strip()][:count]
    return [str(i) for i in range(count)]


def model_constants() -> dict[str, Any]:
    """MODEL_CONSTANTS from framework/engine/memory_model.py (the repository's, not an installed
    copy's); a missing name is left out."""
    sys.path.insert(0, str(ROOT))
    from framework.engine import memory_model

    return {n: getattr(memory_model, n) for n in MODEL_CONSTANTS if hasattr(memory_model, n)}


def table_entry(gpus: dict[str, Any], name: str, total: int) -> tuple[str, int] | None:
    """The GPUS entry for a device called `name` (torch's) of `total` bytes: those whose type
    (the part before '-') the name contains, the nearest in size."""
    family = [(k, int(v.memory_bytes)) for k, v in gpus.items()
              if k.split("-")[0].lower() in name.lower()]
    if not family:
        return None
    return min(family, key=lambda kv: abs(kv[1] - total))


def probe_checks(device: int, entry: str, constants: dict[str, Any], budget: Budget
                 ) -> list[Check]:
    """context, cublas and gpu_table on device `device` (`entry` of CUDA_VISIBLE_DEVICES)."""
    tag = f"[cuda:{device}]"
    steps: dict[str, tuple[dict[str, Any], int]] = {}
    obs = probe = None
    error = None
    try:
        obs = Observer(base_env())
        obs.free(device, budget.left(90.0))
        probe = Proc(["--role", "probe"], {**base_env(), "CUDA_VISIBLE_DEVICES": entry})
        for name in ("imported", "context", "tensors", "gemm", "workspace"):
            line = probe.readline(budget.left(120.0))
            if line is None:
                raise RuntimeError(f"the probe stopped before '{name}' ({probe.stderr_tail()})")
            data = json.loads(line)
            steps[name] = (data, obs.free(device))
            probe.send("go")
    except (RuntimeError, OSError, ValueError) as e:
        error = f"not measured: {_first_line(e)}"
    finally:
        for p in (probe, obs):
            if p is not None:
                p.end()

    ctx_const = constants.get("CUDA_CONTEXT_BYTES")
    nt_const = constants.get("NON_TORCH_BYTES_TP1")
    checks = []
    context = non_torch = workspace = None
    values: dict[str, Any] = {"steps": {k: {**v[0], "observer_free": v[1]}
                                        for k, v in steps.items()}}
    if "context" in steps:
        context = steps["imported"][1] - steps["context"][1] - steps["context"][0]["reserved"]
        values["context_bytes"] = context
    if "gemm" in steps:
        non_torch = ((steps["tensors"][1] - steps["gemm"][1])
                     - (steps["gemm"][0]["reserved"] - steps["tensors"][0]["reserved"]))
        values["gemm_non_torch_bytes"] = non_torch
    if "workspace" in steps and steps["workspace"][0]["cleared"]:
        workspace = steps["workspace"][0]["reserved_with"] - steps["workspace"][0]["reserved_without"]
        values["cublas_workspace_bytes"] = workspace

    if context is None or ctx_const is None:
        ok, measured = False, error or "CUDA_CONTEXT_BYTES missing from memory_model.py"
    else:
        tol = max(CONTEXT_TOLERANCE_BYTES, CONTEXT_TOLERANCE_SHARE * ctx_const)
        ok = abs(context - ctx_const) <= tol
        measured = (f"context {gib(context)} vs CUDA_CONTEXT_BYTES {gib(ctx_const)} "
                    f"({(context - ctx_const) / MIB:+.0f} MiB; CUDA_MODULE_LOADING="
                    f"{steps['context'][0].get('module_loading')})")
    checks.append(Check(f"context{tag}", ok, measured,
                        f"within {mib(CONTEXT_TOLERANCE_BYTES)} or "
                        f"{CONTEXT_TOLERANCE_SHARE:.0%} of CUDA_CONTEXT_BYTES",
                        RELIES["context"], {**values, "CUDA_CONTEXT_BYTES": ctx_const}))

    if non_torch is None or nt_const is None:
        ok, measured = False, error or "NON_TORCH_BYTES_TP1 missing from memory_model.py"
    else:
        total = non_torch + (workspace or 0)
        ok = total <= nt_const
        measured = (f"first bf16 GEMM: {mib(non_torch)} outside torch's allocator + cuBLAS "
                    f"workspaces {mib(workspace) if workspace is not None else '? (no clear)'} "
                    f"inside it = {mib(total)} vs NON_TORCH_BYTES_TP1 {mib(nt_const)}")
    checks.append(Check(f"cublas{tag}", ok, measured,
                        "cuBLAS's memory (both parts) <= NON_TORCH_BYTES_TP1",
                        RELIES["cublas"], {**values, "NON_TORCH_BYTES_TP1": nt_const}))

    gpus = constants.get("GPUS")
    if "context" not in steps or gpus is None:
        ok, measured = False, error or "GPUS missing from memory_model.py"
    else:
        name, total = steps["context"][0]["name"], steps["context"][0]["total"]
        found = table_entry(gpus, name, total)
        ok = found is not None and abs(found[1] - total) <= TOTAL_TOLERANCE_BYTES
        measured = (f"{name}: total {gib(total)} vs "
                    + (f"GPUS['{found[0]}'] {gib(found[1])}" if found else "no GPUS entry"))
    checks.append(Check(f"gpu_table{tag}", ok, measured,
                        f"an entry of this type within {gib(TOTAL_TOLERANCE_BYTES)}",
                        RELIES["gpu_table"], values))
    return checks


def refuse(reason: str) -> int:
    print(f"gpu_facts: refused, {reason}: run it on a node with an NVIDIA GPU and a CUDA build of "
          "torch", file=sys.stderr)
    return 2


def gpu_presence() -> tuple[int, dict[str, Any]]:
    """(visible CUDA GPUs, versions); never initialises CUDA when NVML answers (device_count
    asks NVML first) and this process forks nothing anyway."""
    import torch

    info = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if not torch.version.cuda:
        return 0, info
    return torch.cuda.device_count(), info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON document instead of lines")
    ap.add_argument("--devices", default="all",
                    help="devices for the context/cublas/gpu_table checks: all, or 0,1,...")
    ap.add_argument("--budget-s", type=float, default=270.0,
                    help="wall-clock budget; checks not reached in it FAIL as not measured")
    ap.add_argument("--role", nargs="*", help=argparse.SUPPRESS)
    ap.add_argument("--child-timeout-s", type=float, default=30.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.role:
        role, rest = args.role[0], args.role[1:]
        if role == "fork-parent":
            print(json.dumps(role_fork_parent(rest[0], args.child_timeout_s)), flush=True)
        elif role == "observer":
            role_observer()
        elif role == "holder":
            role_holder(int(rest[0]))
        elif role == "probe":
            role_probe()
        return 0

    try:
        count, info = gpu_presence()
    except ImportError:
        return refuse("torch is not installed")
    if not info["cuda"]:
        return refuse(f"no CUDA GPU (torch {info['torch']} is a CPU build)")
    if count <= 0:
        return refuse(f"no CUDA GPU visible (torch {info['torch']}, CUDA {info['cuda']}, "
                      f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")

    started = time.monotonic()
    budget = Budget(args.budget_s)
    try:
        constants = model_constants()
    except Exception as e:  # noqa: BLE001 - the memory checks say it, the rest still run
        constants = {}
        info["memory_model_error"] = _first_line(e)
    entries = visible_entries(count)
    try:
        devices = (list(range(len(entries))) if args.devices == "all"
                   else [int(d) for d in args.devices.split(",")])
    except ValueError:
        devices = [-1]
    if any(not 0 <= d < len(entries) for d in devices):
        ap.error(f"--devices {args.devices}: the visible devices are 0..{len(entries) - 1}")
    if not args.json:
        print(f"gpu_facts: torch {info['torch']}, CUDA {info['cuda']}, {count} GPU(s) visible; "
              f"memory checks on cuda:{','.join(map(str, devices))}", flush=True)
    checks: list[Check] = []

    def emit(new: list[Check]) -> None:
        checks.extend(new)
        if not args.json:
            for c in new:
                print(c.line(), flush=True)

    emit(fork_checks(budget))
    emit([release_check(budget)])
    for d in devices:
        emit(probe_checks(d, entries[d], constants, budget))
    failed = [c.name for c in checks if not c.ok]
    if args.json:
        print(json.dumps({**info, "gpus_visible": count, "devices": devices,
                          "elapsed_s": round(time.monotonic() - started, 1),
                          "passed": not failed, "checks": [asdict(c) for c in checks]},
                         indent=1, default=str))
    else:
        print(f"gpu_facts: {len(checks) - len(failed)} PASS, {len(failed)} FAIL"
              + (f" ({', '.join(failed)}; README, 'First time on a GPU cluster', says what each "
                 "means)" if failed else "") + f", {time.monotonic() - started:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
