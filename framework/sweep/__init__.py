"""A sweep end to end: its files loaded and cross-checked (`loader`), the ask -> place ->
trial -> record -> tell loop (`runner`), servers kept for reuse (`server_pool`), the cost
estimate (`plan`) and the cluster check before a sweep (`doctor`)."""
