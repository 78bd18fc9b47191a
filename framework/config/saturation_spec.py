"""The sweep's `search.saturation:` section: when a measured run counts as over-saturated
(its queue of waiting requests grows without bound) and ends early. The rule itself is
framework.trial.saturation's. Unknown keys are errors."""

from __future__ import annotations

from pydantic import BaseModel
from pydantic import ConfigDict
from pydantic import Field


class SaturationSpec(BaseModel):
    """`enabled`: end an over-saturated run early (its verdict and evidence are recorded either
    way). The server's waiting requests, sampled every 0.5 s, are judged over the later half
    of the run so far, once the run has lasted `min_duration_s` and that half holds
    `min_samples` samples: over-saturated when their least-squares slope is positive with a
    relative 95% margin of error below `max_margin` and the fitted line gains at least
    `min_growth` waiting requests over the half. A rate step of capacity mode stopped so is
    one where the SLA did not hold."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    min_duration_s: float = Field(default=10.0, gt=0)
    min_samples: int = Field(default=6, ge=3)
    min_growth: float = Field(default=4.0, gt=0)
    max_margin: float = Field(default=1.0, gt=0)
