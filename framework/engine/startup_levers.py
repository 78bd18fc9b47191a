"""Start-up levers: flags and actions that shorten a server's start-up, chosen per trial.
Pure; table-tested in tests/unit/test_startup_levers.py. Each lever used is named in the
trial row (`startup_levers`); on the CPU engine every lever but `warm_start` is inert, on
FakeEngine every one.

- `warm_start` (CPU and GPU): a per-node zygote with vLLM imported forks the server's API
  server, EngineCore and workers, instead of each importing torch and vLLM again
  (framework.engine.zygote; the zygotes: cluster/zygote_keeper.py). Not with vLLM's Ray
  executor, whose servers stay in the actor's process. Takes precedence over `fork_start`.

- `fork_start` (opt-in, GPU): vLLM's API server runs in a child process of the server actor,
  where vLLM may fork its EngineCore and workers instead of spawning them (inside a Ray actor
  it must spawn: each process imports torch and vLLM again); framework.engine.serve_process.
  Not with vLLM's Ray executor (`distributed-executor-backend: ray`, which TP x PP > 1 gets
  by default), whose servers stay in the actor's process. Inert on CPU: vLLM's CPU platform
  sets VLLM_WORKER_MULTIPROC_METHOD=spawn itself (vllm/platforms/cpu.py,
  `check_and_update_config`), so there it would only add a process. Opt-in because its gain
  is unmeasured here (no GPU) and `vllm serve` itself now spawns (cli_env_setup,
  vllm/entrypoints/serve/utils/api_utils.py).

- `cudagraph_sizes`: `--max-cudagraph-capture-size <max-num-seqs>`. vLLM 0.32 captures graphs
  for batch sizes up to min(2 x max-num-seqs x decode query len, 512)
  (vllm/config/vllm.py, VllmConfig._set_cudagraph_sizes); a decode batch never holds more than
  max-num-seqs sequences, so the sizes above it serve only mixed prefill batches. Opt-in
  (it changes which mixed batches replay a graph), and only where the trial captures graphs
  (not enforce-eager, not -O0) and the user set no capture sizes.
- `compile_cache`: the trial compiles (GPU, not enforce-eager, -O1 or more) and its compile cache
  is the node's shared one (VLLM_CACHE_ROOT under the sweep's cache dir, sweep/loader.py):
  named so a row says a warm cache may have shortened its start-up.
- `page_cache`: the model's weight files are read into the node's page cache ahead of the
  server (framework.cluster.page_cache, a low-priority Ray task on the trial's node).
- `load_format`: `--load-format fastsafetensors` (vllm/model_executor/model_loader/
  default_loader.py) when the fastsafetensors package is installed, the model is safetensors and
  the user chose no load format.
"""

from __future__ import annotations

from collections.abc import Collection
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from typing import get_args

from framework.base.vocabulary import Scalar
from framework.base.vocabulary import StartupLever

LEVERS: tuple[str, ...] = get_args(StartupLever)


@dataclass(frozen=True)
class LeverPlan:
    """Flags a trial's server gets on top of its own (`flags`), and the levers used (`names`)."""

    flags: Mapping[str, Scalar] = field(default_factory=dict)
    names: tuple[str, ...] = ()

    @property
    def page_cache(self) -> bool:
        return "page_cache" in self.names


def _on(flags: Mapping[str, Scalar | None], name: str) -> bool:
    value = flags.get(name)
    return value is True or str(value).lower() in ("1", "true")


def _captures_graphs(flags: Mapping[str, Scalar | None]) -> bool:
    level = str(flags.get("optimization-level", flags.get("O", 2)))
    return not _on(flags, "enforce-eager") and level not in ("0", "O0")


def plan_levers(enabled: Collection[str], *, engine: str, flags: Mapping[str, Scalar | None],
                installed: Collection[str] = (), safetensors: bool = True) -> LeverPlan:
    """The levers of `enabled` that apply to one trial with these `flags` on this engine;
    `installed`: optional loader packages present on the nodes (e.g. "fastsafetensors")."""
    in_actor = flags.get("distributed-executor-backend") == "ray"
    warm = ("warm_start",) if ("warm_start" in enabled and engine in ("cpu", "gpu")
                               and not in_actor) else ()
    if engine != "gpu":
        return LeverPlan(names=warm)
    forked = ("fork_start",) if "fork_start" in enabled and not (in_actor or warm) else ()
    add: dict[str, Scalar] = {}
    names: list[str] = []
    seqs = flags.get("max-num-seqs")
    if ("cudagraph_sizes" in enabled and _captures_graphs(flags) and seqs is not None
            and not {"cudagraph-capture-sizes", "max-cudagraph-capture-size",
                     "compilation-config"} & set(flags)):
        add["max-cudagraph-capture-size"] = int(seqs)
        names.append("cudagraph_sizes")
    if "compile_cache" in enabled and _captures_graphs(flags):
        names.append("compile_cache")
    if "page_cache" in enabled and flags.get("load-format") != "dummy":
        names.append("page_cache")
    if ("load_format" in enabled and "fastsafetensors" in installed and safetensors
            and flags.get("load-format") is None):
        add["load-format"] = "fastsafetensors"
        names.append("load_format")
    return LeverPlan(flags=add, names=(*names, *forked, *warm))
