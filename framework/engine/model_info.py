"""Architecture facts from a model folder's config.json (no weights, no network)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from framework.base.errors import ConfigError


@dataclass(frozen=True)
class ModelInfo:
    num_layers: int
    num_heads: int
    num_kv_heads: int
    hidden_size: int
    max_position_embeddings: int | None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def tp_problem(self, tp: int) -> str | None:
        """Why tensor parallel size `tp` cannot shard this model (None if it can): vLLM needs
        TP to divide the attention heads, and KV heads to divide by TP or TP by KV heads."""
        if tp < 1:
            return f"tensor parallel size must be >= 1, got {tp}"
        if self.num_heads % tp:
            return f"tensor parallel size {tp} does not divide the model's {self.num_heads} attention heads"
        if self.num_kv_heads % tp and tp % self.num_kv_heads:
            return (f"tensor parallel size {tp} and the model's {self.num_kv_heads} KV heads do not "
                    "divide one another")
        return None


def read_model_info(model_dir: Path, source: str = "") -> ModelInfo:
    """Parse `model_dir/config.json`; a missing or unreadable file is a ConfigError."""
    path = model_dir / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(source or str(path), "model", str(model_dir),
                          f"cannot read config.json: {exc}") from None
    cfg = cfg.get("text_config", cfg)
    try:
        heads = int(cfg["num_attention_heads"])
        return ModelInfo(num_layers=int(cfg["num_hidden_layers"]), num_heads=heads,
                         num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                         hidden_size=int(cfg["hidden_size"]),
                         max_position_embeddings=cfg.get("max_position_embeddings"))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(source or str(path), "model", str(model_dir),
                          f"config.json lacks {exc}") from None
