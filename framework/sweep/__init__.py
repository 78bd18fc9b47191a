"""A sweep end to end: its files loaded and cross-checked (`loader`; every value a flag can take,
`value_checks`; the parts against each other, `cross_checks`), the load every trial receives
(`trial_load`), the ask -> place -> trial -> record -> tell loop (`runner`), one asked trial's
flags, shape, bundles and server key worked out once (`trial_plan`), servers kept for reuse and
stopped in the background (`server_pool`), the cost estimate (`plan`), the cluster check before
a sweep (`doctor`) and a sweep run as a Ray job (`job_dir`)."""

from framework.base.exports import lazy_exports

__getattr__, __all__ = lazy_exports(__name__, {
    "Sweep": "loader",
    "load": "loader",
    "load_plan": "trial_load",
    "Runner": "runner",
    "TrialPlan": "trial_plan",
    "ServerPool": "server_pool",
})
