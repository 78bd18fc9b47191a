"""Flag and environment names that look like credentials (pure).

A sweep file is recorded: fixed flags land in `vllm_argv` and `serve_command` (trial rows,
report, `best`, exports), `server.env` in the server actors' runtime_env (Ray's dashboard and
tables). So a name that looks like a credential is refused there, and in the search space.

A name is split into word parts at `-` and `_` (case-insensitive; leading dashes dropped). It
looks like a credential when a part ends in `token`, `key` or `secret` (`hf-token`, `apikey`,
`AWS_SECRET_ACCESS_KEY`, `S3_ACCESS_KEY_ID`) or contains `password`, `passwd` or `secret`, except
where the next part says it is not one (NOT_SECRET_AFTER):
- `token` followed by `threshold`, `id` or `ids` counts text tokens: vLLM 0.32's
  `long-prefill-token-threshold`, `dbo-decode-token-threshold`, `dbo-prefill-token-threshold`,
  `return-tokens-as-token-ids`, VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD,
  VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD;
- any of them followed by `file`, `path` or `dir` names where a credential lies, not the
  credential (HF_TOKEN_PATH, `api-key-file`).
Parts such as `tokens`, `tokenizer`, `keyfile` (`ssl-keyfile`: a path) are no credential
words: `max-num-batched-tokens`, `tokenizer-mode`, `max-tokens`, `kv-cache-dtype` pass. Of
vLLM 0.32's serve flags only `api-key` and `hf-token` look like credentials (unit-tested
against the installed vLLM's parser).
"""

from __future__ import annotations

import re

ENDINGS = ("token", "key", "secret")
INSIDE = ("password", "passwd", "secret")
NOT_SECRET_AFTER: dict[str, frozenset[str]] = {
    "token": frozenset({"threshold", "id", "ids"}),
}
LOCATION = frozenset({"file", "path", "dir"})  # the part after names where it lies

API_KEY_NAMES = ("api-key", "vllm-api-key")  # vLLM's own key: server.api_key_env carries it
DEV_MODE = "VLLM_SERVER_DEV_MODE"  # opens routes outside vLLM's API-key check

# flags with an environment variable the servers read instead (huggingface_hub reads HF_TOKEN)
FLAG_ENV = {"hf-token": "HF_TOKEN"}


def words(name: str) -> list[str]:
    """`--HF_token` -> ["hf", "token"]."""
    return [w for w in re.split(r"[-_]", name.lstrip("-").lower()) if w]


def normalized(name: str) -> str:
    """A flag or variable name as `api-key` (no leading dashes, lower case, `-` between parts)."""
    return "-".join(words(name))


def looks_secret(name: str) -> bool:
    """Whether `name` (a flag or an environment variable) looks like a credential."""
    parts = words(name)
    for i, part in enumerate(parts):
        after = parts[i + 1] if i + 1 < len(parts) else ""
        ending = next((e for e in ENDINGS if part.endswith(e)), None)
        if ending is None and not any(w in part for w in INSIDE):
            continue
        if after in LOCATION or after in NOT_SECRET_AFTER.get(ending or "", ()):
            continue
        return True
    return False


def is_api_key(name: str) -> bool:
    """vLLM's API key itself: the flag `api-key` or the variable VLLM_API_KEY, in any spelling."""
    return normalized(name) in API_KEY_NAMES


def safe_way(name: str, flag: bool) -> str:
    """The one-line advice for a credential-like `name` found in a sweep file (`flag`: a flag
    of server.args or the search space; else a variable of server.env)."""
    variable = name if not flag else FLAG_ENV.get(normalized(name),
                                                  "the environment variable the servers read")
    return (f"a credential does not belong in the sweep file (it would be recorded: trial rows, "
            f"report, exports, Ray's dashboard); set {variable} in the driver's environment and "
            f"list it in server.secret_env: servers get it as they get the API key, unrecorded")
