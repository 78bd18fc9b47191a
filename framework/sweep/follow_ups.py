"""What a recorded trial queues next in the study: its run-setting siblings (server.reuse), the
corrected prediction's best untried configuration (search.prior_refit_every), or itself once
more after its node died (cluster.retry_node_lost)."""

from __future__ import annotations

from framework.config.specs import SweepSpec
from framework.search.tuner import Proposal
from framework.search.tuner import Tuner
from framework.sweep.loader import Sweep
from framework.sweep.prior import Prior
from framework.trial.run import TrialOutcome


def queue_siblings(sweep: Sweep, tuner: Tuner, p: Proposal, outcome: TrialOutcome) -> None:
    """server.reuse with a model-guided sampler: a trial that started a server and measured
    on it is followed by its configuration at the other values of its discrete run
    settings, which then run on that server (the grid sampler orders its walk instead)."""
    spec = sweep.spec
    if (spec.server.reuse and spec.search.sampler != "grid"
            and not outcome.server_reused and p.confirm_of is None and not p.is_baseline
            and outcome.fail_reason in (None, "pruned")):
        tuner.enqueue_new(sweep.space.siblings(p.params))


def queue_corrected(prior: Prior | None, tuner: Tuner, p: Proposal, row: dict) -> None:
    """search.prior_refit_every: the best untried configuration under the prediction
    corrected by what was measured so far (sweep.prior) runs next."""
    if prior is not None and p.confirm_of is None:
        prior.observe(p.params, row)
        best = prior.corrected_next(tuner.tried())
        if best is not None:
            tuner.enqueue_new([best])


def queue_retry(spec: SweepSpec, tuner: Tuner, p: Proposal, row: dict) -> bool:
    """Queue a node_lost trial's configuration again, once, if the sweep asks for it."""
    if row["fail_reason"] != "node_lost" or not spec.cluster.retry_node_lost:
        return False
    if p.retry_of is not None:
        return False
    tuner.enqueue_retry(p.params, p.is_baseline, p.number)
    return True
