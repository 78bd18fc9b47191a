"""The price of a GPU-hour, with its date and source, and the price of one replica-hour.

The table holds public on-demand list prices for one GPU, per GPU type of
framework.engine.memory_model.GPUS, each with the page it was read from and that page's date.
List prices differ 2-3x between providers; a sweep's `pricing:` (config.target_spec) overrides
them. A type without a verified public price has none here: its cost is absent until the user
gives one. The CPU engine has no table: its price is the user's `per_replica_hour` or absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from framework.base.errors import ConfigError
from framework.config.target_spec import PricingSpec
from framework.config.yaml_io import read_yaml

_TECHBYTES = ("https://techbytes.app/posts/serverless-gpu-pricing-matrix-modal-replicate-lambda-2026/"
              " (vendor list prices verified there on 2026-05-07)")


@dataclass(frozen=True)
class ListPrice:
    per_gpu_hour: float
    provider: str
    date: str
    source: str


PRICES: dict[str, ListPrice] = {
    "H100-80GB": ListPrice(3.9492, "Modal", "2026-05-07", _TECHBYTES),
    "A100-80GB": ListPrice(2.4984, "Modal", "2026-05-07", _TECHBYTES),
    "A100-40GB": ListPrice(1.48, "Lambda", "2026-05-07", _TECHBYTES),
    "L40S-48GB": ListPrice(1.9512, "Modal", "2026-05-07", _TECHBYTES),
    "L4-24GB": ListPrice(0.7992, "Modal", "2026-05-07", _TECHBYTES),
}
NO_PUBLIC_PRICE = ("H200-141GB", "A10G-24GB")  # known to the memory model, no verified list price


@dataclass(frozen=True)
class Price:
    """What one replica (TP x PP GPUs, or one CPU server) costs per hour, and where it came from."""

    per_replica_hour: float
    per_gpu_hour: float | None
    currency: str
    source: str


def read_price_file(path: Path) -> dict[str, float]:
    """A YAML mapping GPU type -> price per GPU-hour (> 0); anything else is a ConfigError."""
    prices: dict[str, float] = {}
    for gpu, price in read_yaml(path).items():
        if isinstance(price, bool) or not isinstance(price, int | float) or not price > 0:
            raise ConfigError(str(path), str(gpu), price, "a price per GPU-hour must be a number > 0")
        prices[str(gpu)] = float(price)
    return prices


def resolve_price(pricing: PricingSpec, *, engine: str, gpu: str | None, tp: int = 1, pp: int = 1,
                  file_prices: Mapping[str, float] | None = None, dp: int = 1) -> Price | None:
    """The replica-hour price: on GPUs, the GPU-hour price x TP x PP x DP, taken from (first found)
    `per_gpu_hour`, `gpus[gpu]`, the price file, the table; on CPU (and FakeEngine), only the
    user's `per_replica_hour`. None when there is no price: never invented."""
    if engine != "gpu":
        if pricing.per_replica_hour is None:
            return None
        return Price(pricing.per_replica_hour, None, pricing.currency, "sweep pricing.per_replica_hour")
    if pricing.per_replica_hour is not None:
        return Price(pricing.per_replica_hour, None, pricing.currency, "sweep pricing.per_replica_hour")
    if gpu is None:
        return None
    if pricing.per_gpu_hour is not None:
        per_gpu, source = pricing.per_gpu_hour, "sweep pricing.per_gpu_hour"
    elif gpu in pricing.gpus:
        per_gpu, source = pricing.gpus[gpu], f"sweep pricing.gpus.{gpu}"
    elif file_prices and gpu in file_prices:
        per_gpu, source = file_prices[gpu], f"price file {pricing.file}"
    elif gpu in PRICES:
        listed = PRICES[gpu]
        return Price(listed.per_gpu_hour * tp * pp * dp, listed.per_gpu_hour, "USD",
                     f"{listed.provider} list price, {listed.date}: {listed.source}")
    else:
        return None
    return Price(per_gpu * tp * pp * dp, per_gpu, pricing.currency, source)
