"""Where a sweep's results go (`results_dir`): a local folder, or an object store URI
(`s3://bucket/prefix`, `gs://bucket/prefix`) written through pyarrow.fs (results/object_store.py).
"""

from __future__ import annotations

import re

URI = re.compile(r"^(?P<scheme>[a-z][a-z0-9+.-]*)://(?P<rest>[^?#]*)(?P<query>\?[^#]*)?$")
SCHEMES = ("s3", "gs", "gcs")


def is_store_uri(text: str) -> bool:
    """True for `scheme://...` text: a results_dir meant for an object store."""
    return URI.match(text) is not None


def uri_problem(uri: str) -> str | None:
    """Why `uri` cannot name a results location (None if it can): the scheme is one of
    SCHEMES and a bucket is named. Nothing is contacted."""
    m = URI.match(uri)
    if m is None:
        return "not a URI (scheme://bucket/prefix)"
    if m["scheme"] not in SCHEMES:
        return f"scheme {m['scheme']!r} is not supported; use one of {', '.join(SCHEMES)}"
    if not m["rest"].strip("/"):
        return "names no bucket"
    return None
