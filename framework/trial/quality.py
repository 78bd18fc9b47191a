"""How far a trial's greedy outputs are from the baseline's, and whether that is more than the
baseline's own run-to-run noise. Pure.

Both runs answer the same probe prompts (framework.load.probe). Per prompt, the common prefix is
the positions before the first token where the two greedy answers differ: after it the two
continue from different contexts, so neither their tokens nor their logprobs are comparable
any more (vLLM's own model tests compare greedy outputs the same way, up to the first
mismatch).

- token agreement = sum over prompts of the common prefix length / sum of the answer lengths
  (the fraction of generated tokens produced before the answers diverged; 1.0 = identical);
- logprob MAD = mean over the common prefix positions of |logprob_a - logprob_b| (nats; the
  chosen token's logprob, same context on both sides); None when no position is shared.
  Reported next to the baseline's own MAD; the verdict rests on the agreement alone, since a
  MAD over a short common prefix says little.

The verdict (`judge`): the baseline probes twice on its own server, at two concurrencies, and
its self-agreement is the noise floor (batching alone changes outputs). A trial's agreement
must reach `required = self_agreement - margin`, or `min(min_token_agreement,
self_agreement - margin)` when the sweep sets that SLA key: a change is never blamed for
divergence the baseline shows against itself, and the SLA bar is the bar whenever the
baseline itself clears it.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass

from framework.base.vocabulary import MIN_TOKEN_AGREEMENT
from framework.load.probe import ProbeAnswer

NOISE_MARGIN = 0.02  # agreement a trial may lose below the baseline's self-agreement


@dataclass(frozen=True)
class Agreement:
    """One comparison of two probe runs: token agreement and logprob MAD (module docstring);
    `positions`: the tokens compared, `shared`: those in a common prefix."""

    token_agreement: float
    logprob_mad: float | None
    positions: int
    shared: int


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Positions before the first index where `a` and `b` differ (the shorter's length if one
    is a prefix of the other)."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def compare(reference: Sequence[ProbeAnswer], other: Sequence[ProbeAnswer]) -> Agreement:
    """Token agreement and logprob MAD of `other` against `reference` (same prompts, same
    order). A prompt's length counts as the longer of its two answers, so an answer cut short
    lowers the agreement. ValueError if the runs answer different numbers of prompts or no
    tokens at all."""
    if len(reference) != len(other):
        raise ValueError(f"{len(reference)} reference answers but {len(other)} to compare")
    positions = shared = 0
    deltas: list[float] = []
    for ref, oth in zip(reference, other):
        k = common_prefix(ref.token_ids, oth.token_ids)
        positions += max(len(ref.token_ids), len(oth.token_ids))
        shared += k
        deltas += [abs(ref.logprobs[i] - oth.logprobs[i]) for i in range(k)]
    if positions == 0:
        raise ValueError("no generated tokens to compare")
    return Agreement(token_agreement=shared / positions,
                     logprob_mad=sum(deltas) / len(deltas) if deltas else None,
                     positions=positions, shared=shared)


@dataclass(frozen=True)
class QualityVerdict:
    """A trial's quality numbers as the row records them (docs/RESULTS.md): its agreement and
    MAD against the baseline's reference run, the baseline's self-agreement and self-MAD, the
    agreement required and whether it was reached. All None, with a `note`, when there was no
    reference to compare with (quality unknown)."""

    token_agreement: float | None
    logprob_mad: float | None
    baseline_agreement: float | None
    baseline_logprob_mad: float | None
    required: float | None
    ok: bool | None
    note: str = ""


def unknown(note: str) -> QualityVerdict:
    """The verdict of a trial whose outputs could not be compared (`note` says why)."""
    return QualityVerdict(None, None, None, None, None, None, note)


def required_agreement(baseline_agreement: float, min_token_agreement: float | None,
                       margin: float = NOISE_MARGIN) -> float:
    """The agreement a trial must reach: self_agreement - margin, capped at the SLA's
    min_token_agreement when set (module docstring)."""
    floor = baseline_agreement - margin
    return floor if min_token_agreement is None else min(min_token_agreement, floor)


def judge(trial: Agreement, baseline: Agreement, min_token_agreement: float | None,
          margin: float = NOISE_MARGIN, note: str = "") -> QualityVerdict:
    """`trial`: the trial's probe against the baseline's reference run; `baseline`: the
    baseline's second probe run against that same reference (its self-agreement)."""
    required = required_agreement(baseline.token_agreement, min_token_agreement, margin)
    return QualityVerdict(token_agreement=trial.token_agreement, logprob_mad=trial.logprob_mad,
                          baseline_agreement=baseline.token_agreement,
                          baseline_logprob_mad=baseline.logprob_mad, required=required,
                          ok=trial.token_agreement >= required, note=note)


def sla_terms(sla: Mapping[str, float], verdict: QualityVerdict | None
              ) -> tuple[dict[str, float], dict[str, float]]:
    """(limits, judged values) for objective.evaluate: `sla` as given and no judged value when
    it has no min_token_agreement; else that key's limit and value for this trial:
    - no verdict (the trial changes no output flag and was not probed): its agreement counts
      as 1.0 against the SLA's limit;
    - a measured verdict: its agreement against `verdict.required` (the SLA's limit, or the
      baseline's noise floor when that is lower: `required_agreement`);
    - an unknown verdict (no baseline reference): 0.0, so quality not shown is quality not met.
    """
    limits = dict(sla)
    if MIN_TOKEN_AGREEMENT not in sla:
        return limits, {}
    if verdict is None:
        return limits, {MIN_TOKEN_AGREEMENT: 1.0}
    if verdict.token_agreement is None or verdict.required is None:
        return limits, {MIN_TOKEN_AGREEMENT: 0.0}
    limits[MIN_TOKEN_AGREEMENT] = verdict.required
    return limits, {MIN_TOKEN_AGREEMENT: verdict.token_agreement}
