"""What a sweep leaves: trial and request rows and their schemas (`rows`), the Parquet store
(`store`), provenance, the diagnosis of a trial, the console output (`console`), the HTML
report and `status` / `best`. The only room that imports pyarrow and pandas."""

from framework.base.exports import lazy_exports

__getattr__, __all__ = lazy_exports(__name__, {
    "ResultStore": "store",
    "trial_columns": "rows",
    "trial_row": "rows",
    "REQUEST_COLUMNS": "rows",
    "best_row": "queries",
    "pareto_front": "queries",
    "state_label": "queries",
    "render_report": "html_report",
    "diagnose": "diagnosis",
})
