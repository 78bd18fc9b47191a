"""The base every room builds on, importing nothing of the project: the error types
(`errors`) and the vocabulary shared by configuration, load, trials and results
(`vocabulary`: `Scalar`, metric names, percentile keys, SLA keys)."""

from framework.base.exports import lazy_exports

__getattr__, __all__ = lazy_exports(__name__, {
    "ConfigError": "errors",
    "ClusterError": "errors",
    "TrialError": "errors",
    "SweepError": "errors",
    "Scalar": "vocabulary",
    "percentile_key": "vocabulary",
    "parse_latency_key": "vocabulary",
    "metric_names": "vocabulary",
    "is_latency_metric": "vocabulary",
})
