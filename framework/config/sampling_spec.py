"""The workload's `sampling:` section: vllm bench serve's sampling flags, same meaning.

Each key is optional; a key left out is not sent, and the server's default applies
(framework.load.sampling explains what that is on vLLM: temperature 1.0 unless the model's
generation_config says otherwise). `temperature: 0` is greedy. The ranges are the ones vLLM
accepts (``SamplingParams._verify_args`` in ``vllm/sampling_params.py``), so a value every
request would fail with is refused when the sweep is loaded. Numbers only (a YAML `yes` or
"0.5" is refused, not read as 1.0 or 0.5). Unknown keys are errors.
"""

from __future__ import annotations

from pydantic import BaseModel
from pydantic import ConfigDict
from pydantic import Field
from pydantic import StrictFloat
from pydantic import StrictInt


class SamplingSpec(BaseModel):
    """Optional sampling fields sent with every request of the sweep (None: not sent)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    top_p: StrictFloat | None = Field(default=None, gt=0, le=1)
    top_k: StrictInt | None = Field(default=None, ge=-1)  # 0 or -1: off
    min_p: StrictFloat | None = Field(default=None, ge=0, le=1)
    temperature: StrictFloat | None = Field(default=None, ge=0, le=2)
    frequency_penalty: StrictFloat | None = Field(default=None, ge=-2, le=2)
    presence_penalty: StrictFloat | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: StrictFloat | None = Field(default=None, gt=0)

    def set_fields(self) -> dict[str, float | int]:
        """The keys given, with their values (what each request carries)."""
        return {k: v for k, v in self.model_dump().items() if v is not None}
