"""The deployment a sweep sizes for: `target:` (the load to carry) and `pricing:` (what a GPU or
a replica costs). Both only describe the question; framework.fleet answers it."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic import model_validator

from framework.config.spec_base import Spec


class TargetSpec(Spec):
    """`request_rate`: requests/s the fleet must carry; `from_trace: true` takes the timed
    trace's own mean rate instead (its requests over its span, at speed-up 1). `headroom`: spare
    capacity kept per replica, so replicas = ceil(rate x (1 + headroom) / capacity_rps)."""

    request_rate: float | None = Field(default=None, gt=0)
    from_trace: bool = False
    headroom: float = Field(default=0.0, ge=0, le=10)

    @model_validator(mode="after")
    def _one_rate(self) -> TargetSpec:
        if (self.request_rate is None) == (not self.from_trace):
            raise ValueError("give exactly one of request_rate or from_trace: true")
        return self


class PricingSpec(Spec):
    """`per_gpu_hour`: the price of one GPU-hour of the sweep's `gpu` type (overrides the table in
    framework.fleet.prices); `gpus`: prices per GPU type (overrides, and adds types); `file`: a
    YAML mapping of GPU type -> price per GPU-hour, read at load time (the sweep's own keys win).
    `per_replica_hour`: the price of one server-hour, the only price on the CPU engine (e.g. a CPU
    node-hour); the tool never invents one. `currency` is a label only."""

    per_gpu_hour: float | None = Field(default=None, gt=0)
    gpus: dict[str, float] = Field(default_factory=dict)
    file: Path | None = None
    per_replica_hour: float | None = Field(default=None, gt=0)
    currency: str = Field(default="USD", min_length=1, max_length=8)

    @model_validator(mode="after")
    def _positive(self) -> PricingSpec:
        for gpu, price in self.gpus.items():
            if not price > 0:
                raise ValueError(f"price for {gpu!r} must be > 0, got {price}")
        return self
