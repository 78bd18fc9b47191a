"""A mix of request classes over one arrival process: which request is of which class, the
requests themselves, and each class's metrics. Seeded and reproducible; pure but for the
tokenizer.

Class assignment (`assign_classes`): class k gets n_k requests, n_k = floor(n x share_k) plus
one for the classes with the largest remainders until they add up to n (largest remainder
method), so each class's share is within 1/n of its weight; the order of the n labels is a
permutation drawn from ``numpy.random.default_rng(seed)``. Class k's prompts are drawn from
its own dataset with a seed derived from (seed, k) (``numpy.random.SeedSequence``), so adding
a class does not change another's prompts.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from framework.base.vocabulary import DEFAULT_PERCENTILES
from framework.base.vocabulary import class_key
from framework.load.metrics import compute_metrics
from framework.load.prompts import RequestSpec

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from framework.load.loadgen import RequestRecord
    from framework.load.workload import Dataset


@dataclass(frozen=True)
class RequestClass:
    """One class of a mix: its name, weight (share = weight / sum of weights) and dataset."""

    name: str
    weight: float
    dataset: Dataset


def class_counts(n: int, weights: Sequence[float]) -> list[int]:
    """Requests per class for n requests (largest remainder method; ties: the earlier class)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not weights or any(not w > 0 for w in weights):
        raise ValueError(f"weights must be > 0, got {list(weights)}")
    total = float(sum(weights))
    exact = [n * w / total for w in weights]
    counts = [int(np.floor(x)) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda k: (-(exact[k] - counts[k]), k))
    for k in by_remainder[: n - sum(counts)]:
        counts[k] += 1
    return counts


def assign_classes(n: int, weights: Sequence[float], seed: int) -> list[int]:
    """The class index of each of n requests: class_counts labels in a seeded random order."""
    labels = np.repeat(np.arange(len(weights)), class_counts(n, weights))
    return [int(k) for k in np.random.default_rng(seed).permutation(labels)]


def class_seed(seed: int, k: int) -> int:
    """The dataset seed of class k in a mix drawn with `seed` (distinct per (seed, k))."""
    return int(np.random.SeedSequence([seed, k]).generate_state(1)[0])


def mix_requests(tokenizer: Tokenizer, classes: Sequence[RequestClass], num_prompts: int,
                 seed: int) -> list[RequestSpec]:
    """`num_prompts` requests of the mix, each tagged with its class (`request_class`): the
    labels of assign_classes, class k's requests drawn in one go from its dataset with
    class_seed(seed, k) and handed out in order. Same arguments, same requests."""
    labels = assign_classes(num_prompts, [c.weight for c in classes], seed)
    drawn = [iter(c.dataset.requests(tokenizer, labels.count(k), class_seed(seed, k)))
             for k, c in enumerate(classes)]
    return [replace(next(drawn[k]), request_class=classes[k].name) for k in labels]


@dataclass(frozen=True)
class Mix:
    """A mix used where a dataset is (load.workload.Dataset's `requests`): mix_requests."""

    classes: tuple[RequestClass, ...]

    def requests(self, tokenizer: Tokenizer, num_prompts: int, seed: int) -> list[RequestSpec]:
        return mix_requests(tokenizer, self.classes, num_prompts, seed)


def class_metrics(records: Sequence[RequestRecord], names: Sequence[str], duration_s: float,
                  percentiles: Sequence[float] = DEFAULT_PERCENTILES,
                  goodput_slo_ms: Mapping[str, float] | None = None) -> dict[str, float | int]:
    """Every class's load metrics, keys prefixed by its name (`chat.p99_ttft_ms`): compute_metrics
    over the class's records with the run's duration (so a class's throughputs add up to the
    run's), plus `<class>.error_rate` = failed / (completed + failed) of the class (0.0 when
    none was sent)."""
    out: dict[str, float | int] = {}
    for name in names:
        mine = [r for r in records if r.request_class == name]
        metrics = compute_metrics(mine, duration_s, percentiles, goodput_slo_ms)
        metrics["error_rate"] = metrics["failed"] / len(mine) if mine else 0.0
        out.update({class_key(name, k): v for k, v in metrics.items()})
    return out
