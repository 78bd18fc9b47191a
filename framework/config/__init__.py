"""Sweep and search-space YAML into frozen, validated specs (`specs`, `search_space`).
Imports only `base`: nothing here starts, measures or stores anything."""

from framework.base.exports import lazy_exports

__getattr__, __all__ = lazy_exports(__name__, {
    "SweepSpec": "specs",
    "load_sweep": "specs",
    "SearchSpace": "search_space",
    "load_search_space": "search_space",
    "grid_values": "search_space",
    "grid_size": "search_space",
})
