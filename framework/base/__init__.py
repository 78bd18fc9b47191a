"""The base every room builds on, importing nothing of the project: the error types
(`errors`) and the vocabulary shared by configuration, load, trials and results
(`vocabulary`: `Scalar`, metric names, percentile keys, SLA keys)."""
