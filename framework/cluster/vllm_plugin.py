"""A vLLM platform plugin that lets vLLM's Ray executor run on CPU-only Ray clusters.

Registered as entry point `vllm_sweep_cpu` in group `vllm.platform_plugins`; vLLM calls
`register()` in every process that resolves its platform. It activates only when
`VLLM_SWEEP_CPU_RAY=1` (set by vllm-sweep for CPU-engine trials); otherwise it returns None and
vLLM picks its platform as usual, so GPU runs use stock vLLM. `VLLM_TARGET_DEVICE` must be
unset: setting it to cpu makes vLLM skip platform plugins.

What it changes (docs/ARCHITECTURE.md, "Why in-process vLLM in an actor"; vLLM 0.32's
vllm/v1/executor/ray_executor_v2.py and vllm/platforms/cpu.py):
1. `RayCpuPlatform` = vLLM's `CpuPlatform` with `ray_device_key = "CPU"`: placement-group bundles
   of `{CPU: n}` count as devices, so vLLM puts one worker in each of the trial's bundles.
2. vLLM's Ray executors request `resources={"CPU": k}` for workers on non-GPU platforms, which
   Ray rejects; workers are requested with no resources instead (the bundle already holds them).
3. `RuntimeContext.get_accelerator_ids()` gains a `"CPU": []` entry, which vLLM's workers look
   up under the device key.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Callable
from collections.abc import Sequence
from types import ModuleType
from typing import Any

ENV_FLAG = "VLLM_SWEEP_CPU_RAY"
PLATFORM = "framework.cluster.vllm_plugin.RayCpuPlatform"
_ANNOUNCED = False
_EXECUTOR_MODULE = "vllm.v1.executor.ray_executor_v2"  # the default Ray executor in vLLM 0.32


def register() -> str | None:
    if os.environ.get(ENV_FLAG) != "1":
        return None
    if not _ANNOUNCED:
        print(f"vllm-sweep CPU Ray platform plugin active (pid {os.getpid()})", file=sys.stderr,
              flush=True)
        globals()["_ANNOUNCED"] = True
    _patch_accelerator_ids()
    _after_import(_EXECUTOR_MODULE, _patch_executor_module)
    return PLATFORM


def _cpu_worker_kwargs() -> dict[str, Any]:
    return {"num_gpus": 0}


def _patch_executor_module(module: Any) -> None:
    executor = getattr(module, "RayExecutorV2", None)
    if executor is not None and not getattr(executor, "_vllm_sweep_patched", False):
        original = executor._get_actor_resource_kwargs

        def resource_kwargs() -> dict[str, Any]:
            kwargs = original()
            return _cpu_worker_kwargs() if "resources" in kwargs else kwargs

        executor._get_actor_resource_kwargs = staticmethod(resource_kwargs)
        executor._vllm_sweep_patched = True


def _patch_accelerator_ids() -> None:
    from ray.runtime_context import RuntimeContext

    if getattr(RuntimeContext.get_accelerator_ids, "_vllm_sweep_patched", False):
        return
    original = RuntimeContext.get_accelerator_ids

    def get_accelerator_ids(self: RuntimeContext):
        ids = dict(original(self))
        ids.setdefault("CPU", [])
        return ids

    get_accelerator_ids._vllm_sweep_patched = True  # type: ignore[attr-defined]
    RuntimeContext.get_accelerator_ids = get_accelerator_ids


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Runs `patch(module)` right after `name` is first imported (once)."""

    def __init__(self, name: str, patch: Callable[[ModuleType], None]) -> None:
        self.name, self.patch = name, patch

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader, patch = spec.loader, self.patch
        exec_module = loader.exec_module

        def exec_and_patch(module: ModuleType):
            exec_module(module)
            patch(module)

        loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def _after_import(name: str, patch: Callable[[ModuleType], None]) -> None:
    if name in sys.modules:
        patch(sys.modules[name])
        return
    if not any(isinstance(f, _PatchAfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport(name, patch))


def _platform_base():
    from vllm.platforms.cpu import CpuPlatform

    return CpuPlatform


def __getattr__(name: str):
    """`RayCpuPlatform` is built on first access, so loading the plugin imports no vLLM."""
    if name == "RayCpuPlatform":
        cls = type("RayCpuPlatform", (_platform_base(),), {"ray_device_key": "CPU",
                                                           "__module__": __name__})
        globals()["RayCpuPlatform"] = cls
        return cls
    raise AttributeError(name)
