"""Sweep and search-space YAML into frozen, validated specs (`specs`, `search_space`).
Imports only `base`: nothing here starts, measures or stores anything."""
