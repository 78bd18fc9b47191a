"""From a measured configuration to a deployment: replicas and GPUs for a target load
(`sizing`), the price of a GPU-hour with its date and source (`prices`), and the cost per hour
and per million tokens; a trial's answer as row columns (`columns`). Pure: no Ray, no I/O
except reading a user's price file."""

from framework.base.exports import lazy_exports

__getattr__, __all__ = lazy_exports(__name__, {
    "Fleet": "sizing",
    "fleet_for": "sizing",
    "replicas_for": "sizing",
    "cost_per_mtok": "sizing",
    "Price": "prices",
    "PRICES": "prices",
    "resolve_price": "prices",
    "Target": "columns",
    "Sizing": "columns",
    "FLEET_COLUMNS": "columns",
    "fleet_values": "columns",
})
