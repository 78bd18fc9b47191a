"""Which vLLM flags change a model's outputs, and which of them a trial changes against the
baseline. Pure.

A trial changes the outputs (and so runs the quality probe, framework.trial.quality) when one of
OUTPUT_FLAGS, or a search-space parameter marked `lossy: true`, has a value other than the
baseline's. The baseline is vLLM's defaults plus the sweep's fixed `server.args`: a flag fixed
for every trial changes every trial alike, including the baseline, and so changes nothing
the probe could see. Flag names and neutral values are those of the installed vLLM 0.32
(vllm/engine/arg_utils.py, EngineArgs.add_cli_args; vllm/config/cache.py, model.py,
speculative.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from framework.base.vocabulary import Scalar

# Output-changing flags -> the value that leaves outputs as they are (an absent flag has it):
# a quantized KV cache, weight quantization and the compute dtype change the numbers every
# token is computed with; speculative decoding changes how (and in which batches) tokens are
# computed, so greedy outputs are not guaranteed equal either.
OUTPUT_FLAGS: dict[str, Scalar | None] = {
    "kv-cache-dtype": "auto",
    "kv-cache-dtype-skip-layers": None,
    "dtype": "auto",
    "quantization": None,
    "quantization-config": None,
    "speculative-config": None,
    "spec-method": None,
    "spec-model": None,
    "spec-tokens": None,
}


def output_changes(flags: Mapping[str, Scalar | None], baseline: Mapping[str, Scalar | None],
                   declared: Mapping[str, Scalar | None] | None = None) -> tuple[str, ...]:
    """The flags, in `flags`' order (then `baseline`'s), whose value in `flags` (a trial's) differs
    from their value in `baseline` (the baseline's flags) and that change outputs: OUTPUT_FLAGS
    (absent = its neutral value) and `declared`, the search space's `lossy: true` parameters
    with the value the baseline runs with (their default; absent = that value). A value is
    compared as text, so `8` and `"8"` are one value."""
    neutral: dict[str, Scalar | None] = {**OUTPUT_FLAGS, **(declared or {})}

    def value(source: Mapping[str, Scalar | None], name: str) -> str | None:
        found = source.get(name, neutral[name])
        found = neutral[name] if found is None else found
        return None if found is None else str(found)

    names = [*flags, *(n for n in baseline if n not in flags)]
    return tuple(n for n in names if n in neutral and value(flags, n) != value(baseline, n))
