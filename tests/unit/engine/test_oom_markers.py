"""engine.startup_failure against the messages vLLM 0.32 (and torch beneath it) emit when a server
runs short of memory while starting, formatted as they format them (format_gib: round(GiB, 2)),
and against start-up messages that are not a memory shortage. Each vLLM row names the file
(inside the installed `vllm` package) and function that raises or logs it; the test checks the
quoted fragment is in that file."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from framework.engine.vllm_server import startup_failure

ENGINE_FAILED = ("RuntimeError: Engine core initialization failed. See root cause above. "
                 "Failed core proc(s): {'EngineCore_DP0': 1}")  # vllm/v1/engine/utils.py


DOCS = "See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."


# (file in vllm/, function, fragment quoted from the source, the message as emitted)
OOM = [
    ("v1/worker/utils.py", "request_memory", "is less than desired GPU memory utilization",
     "ValueError: Free memory on device cuda:0 (70.12/79.11 GiB) on startup is less than "
     "desired GPU memory utilization (0.92, 72.78 GiB). Decrease GPU memory utilization or "
     "reduce GPU memory used by other processes."),
    ("v1/worker/utils.py", "request_memory", "is less than the engine's budget",
     "ValueError: Free memory on device cuda:0 (40.5/79.11 GiB) on startup is less than the "
     "engine's budget after excluding external process's weights (0.92, 57.78 GiB). Decrease "
     "GPU memory utilization or reduce GPU memory used by other processes."),
    ("v1/worker/utils.py", "request_memory", "exceed the desired GPU memory utilization",
     "ValueError: Externally held weights on device cuda:0 (75.0/79.11 GiB) exceed the desired "
     "GPU memory utilization (0.92, 72.78 GiB). Increase GPU memory utilization or reduce GPU "
     "memory used by other processes."),
    ("v1/core/kv_cache_utils.py", "_check_enough_kv_cache_memory",
     "No available memory for the cache blocks",
     "ValueError: No available memory for the cache blocks. Try increasing "
     "`gpu_memory_utilization` when initializing the engine (this flag also controls CPU memory "
     f"reservation on the CPU backend, despite its name). {DOCS}"),
    ("v1/core/kv_cache_utils.py", "_check_enough_kv_cache_memory",
     "larger than the available KV cache memory",
     "ValueError: To serve at least one request with the model's max seq len (131072), (20.0 "
     "GiB KV cache is needed, which is larger than the available KV cache memory (3.91 GiB). "
     "Based on the available memory, the estimated maximum model length is 25600. Try "
     "increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU backend) "
     f"or decreasing `max_model_len` when initializing the engine. {DOCS}"),
    ("v1/core/kv_cache_utils.py", "_auto_fit_max_model_len",
     "Cannot auto-fit max_model_len: not enough GPU memory",
     "ValueError: Cannot auto-fit max_model_len: not enough GPU memory available to serve even "
     "a single token. Try increasing `gpu_memory_utilization`."),
    ("v1/worker/gpu_model_runner.py", "GPUModelRunner.load_model",
     "Failed to load model - not enough GPU memory",
     "ERROR 05-01 20:46:51 [v1/worker/gpu_model_runner.py:5146] Failed to load model - not "
     "enough GPU memory. Try lowering --gpu-memory-utilization to free memory for weights, "
     "increasing --tensor-parallel-size, or using --quantization. See https://docs.vllm.ai/en/"
     "latest/configuration/conserving_memory/ for more tips. (original error: CUDA out of "
     "memory. Tried to allocate 1.96 GiB. GPU 0 has a total capacity of 79.11 GiB of which "
     "1.05 GiB is free.)"),
    ("v1/worker/gpu_model_runner.py", "GPUModelRunner._dummy_sampler_run",
     "CUDA out of memory occurred when warming up sampler",
     "RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy "
     "requests. Please try lowering `max_num_seqs` or `gpu_memory_utilization` when "
     "initializing the engine."),
    ("v1/worker/gpu/pool/pooling_runner.py", "PoolingRunner._dummy_pooler_run_task",
     "CUDA out of memory occurred when warming up pooler",
     "RuntimeError: CUDA out of memory occurred when warming up pooler (task='embed') with 256 "
     "dummy requests. Please try lowering `max_num_seqs` or `gpu_memory_utilization` when "
     "initializing the engine."),
    # Not vLLM's text: torch's caching allocator (c10/cuda/CUDACachingAllocator.cpp), as the
    # profile run, weight loading or graph capture raise it, the CUDA runtime's error
    # (c10/cuda/CUDAException.h, e.g. from cudaGraphInstantiate), cuBLAS's handle creation
    # (aten/src/ATen/cuda/CublasHandlePool.cpp) and the host allocator.
    (None, "torch.OutOfMemoryError", "",
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB. GPU 0 has a "
     "total capacity of 79.11 GiB of which 412.00 MiB is free. Including non-PyTorch memory, "
     "this process has 78.69 GiB memory in use. Of the allocated memory 77.10 GiB is allocated "
     "by PyTorch, and 1.02 GiB is reserved by PyTorch but unallocated."),
    (None, "engine.serve's own wording of it", "",
     "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
     "capacity of 22.03 GiB of which 1.25 GiB is free."),
    (None, "CUDA runtime", "", "RuntimeError: CUDA error: out of memory"),
    (None, "cuBLAS", "",
     "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    (None, "host", "", "OSError: [Errno 12] Cannot allocate memory"),
    (None, "host", "", "MemoryError"),
]


NOT_OOM = [
    ("v1/worker/gpu_worker.py", "Worker.determine_available_memory", "Error in memory profiling",
     "AssertionError: Error in memory profiling. Initial free memory 70.0 GiB, current free "
     "memory 71.2 GiB. This happens when other processes sharing the same container release "
     "GPU memory while vLLM is profiling during initialization. To fix this, ensure consistent "
     "GPU memory allocation or isolate vLLM in its own container."),
    ("v1/worker/gpu_worker.py", "Worker.compile_or_warm_up_model",
     "Desired GPU memory utilization is",
     "INFO [v1/worker/gpu_worker.py:1034] Free memory on device (78.68/79.19 GiB) on startup. "
     "Desired GPU memory utilization is (0.95, 75.23 GiB). Actual usage is 14.99 GiB for "
     "consumed memory (weights + non-torch), 0.78 GiB for peak activation, and 0.84 GiB for "
     "CUDAGraph memory. Replace gpu_memory_utilization config with "
     "`--kv-cache-memory=62387683737` (58.1 GiB) to fit into requested memory, or "
     "`--kv-cache-memory=66085349785` (61.55 GiB) to fully utilize gpu memory. Current kv "
     "cache memory in use is 58.11 GiB."),
    ("v1/worker/gpu_worker.py", "Worker.determine_available_memory",
     "which may require lowering",
     "WARNING [v1/worker/gpu_worker.py:791] CUDA graph memory profiling is disabled "
     "(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0). Without it, CUDA graph memory is not "
     "accounted for during KV cache allocation, which may require lowering "
     "--gpu-memory-utilization to avoid OOM. Consider re-enabling it (the default as of "
     "v0.21.0) and increasing --gpu-memory-utilization from 0.9200 to 0.9306."),
    ("v1/core/kv_cache_utils.py", "validate_kv_cache_layout", "cannot express this model's",
     "ValueError: KV cache layout HND cannot express this model's mixed page sizes ([8192, "
     "16384]); a backend should declare block-outermost supported layouts (e.g. BLHNC), or "
     "set VLLM_KV_CACHE_LAYOUT=BLHNC."),
    ("v1/engine/utils.py", "wait_for_engine_startup", "Engine core initialization failed",
     ENGINE_FAILED),
    (None, "CUDA runtime", "", "RuntimeError: CUDA error: an illegal memory access was "
                               "encountered"),
]


def _vllm_source(path: str) -> str:
    """The file's text with adjacent string literals joined, as Python joins them."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    text = (Path(list(spec.submodule_search_locations)[0]) / path).read_text()
    return re.sub(r'"\s*\n\s*f?"', "", text)


@pytest.mark.parametrize("path, function, fragment, message",
                         [row for row in OOM + NOT_OOM if row[0] is not None])
def test_quoted_fragments_are_vllms_text(path, function, fragment, message):
    assert fragment in message
    assert fragment in _vllm_source(path), f"{fragment!r} not in vllm/{path} ({function})"


@pytest.mark.parametrize("reason", ["startup_crash", "invalid_args"])
@pytest.mark.parametrize("path, function, fragment, message", OOM)
def test_memory_shortage_in_the_detail_is_oom_at_startup(reason, path, function, fragment,
                                                         message):
    assert startup_failure(reason, message, "") == ("oom_at_startup", message)


@pytest.mark.parametrize("path, function, fragment, message", OOM)
def test_memory_shortage_in_an_engine_core_log_is_oom_at_startup(path, function, fragment,
                                                                 message):
    """The engine core dies in its own process: the server raises ENGINE_FAILED and the cause
    is a line of the log, prefixed with the process; that line becomes the detail."""
    log = (f"(EngineCore_DP0 pid=243) INFO Available KV cache memory: 3.91 GiB\n"
           f"(EngineCore_DP0 pid=243) {message}\n"
           f"(EngineCore_DP0 pid=243) ERROR EngineCore failed to start.\n{ENGINE_FAILED}")
    assert startup_failure("startup_crash", ENGINE_FAILED, log) == (
        "oom_at_startup", f"(EngineCore_DP0 pid=243) {message}")


@pytest.mark.parametrize("path, function, fragment, message", NOT_OOM)
def test_other_start_up_failures_stay_what_they_were(path, function, fragment, message):
    log = f"INFO Available KV cache memory: 55.45 GiB\n{message}\n{ENGINE_FAILED}"
    assert startup_failure("startup_crash", ENGINE_FAILED, log) == ("startup_crash",
                                                                   ENGINE_FAILED)
    assert startup_failure("invalid_args", message, "") == ("invalid_args", message)


@pytest.mark.parametrize("reason", ["startup_timeout", "not_ready", "interrupted"])
def test_only_crashes_and_rejections_are_refined(reason):
    message = OOM[0][3]
    assert startup_failure(reason, "not ready within 240 s", message) == (
        reason, "not ready within 240 s")
