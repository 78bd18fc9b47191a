"""Build the tiny random-weight Llama that the embedded default sweep serves (no download).

Architecture: vocab 4096, hidden 256, intermediate 512, 2 layers, 4 heads, 2 KV heads, 4096
positions, bf16, about 3.3 M parameters. The tokenizer is a byte-level BPE
trained on the Python standard library's own sources, so the build needs no network. The
weights are random but seeded: the same seed gives the same files.
"""

from __future__ import annotations

import json
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# where `make model` builds it, and the quickstart names it (relative to the checkout)
TINY_MODEL_DIR = Path("models/tiny-llama")
SPECIAL_TOKENS = ("<s>", "</s>", "<pad>", "<unk>")
CHAT_TEMPLATE = (
    "{% for message in messages %}<s>{{ message['role'] }}\n{{ message['content'] }}</s>\n"
    "{% endfor %}{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TinyLlamaShape:
    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 512
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 4096


def _training_text(limit_bytes: int = 4_000_000) -> list[str]:
    """Stdlib sources, in sorted order so the tokenizer is reproducible."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts: list[str] = []
    total = 0
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="ignore")
        texts.append(text)
        total += len(text)
        if total >= limit_bytes:
            break
    return texts


def build_tokenizer(out_dir: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer
    from tokenizers import decoders
    from tokenizers import models
    from tokenizers import pre_tokenizers
    from tokenizers import trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_training_text(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))


def build_tiny_llama(out_dir: Path, seed: int = 0, shape: TinyLlamaShape = TinyLlamaShape()) -> Path:
    """Write config.json, safetensors weights and tokenizer files into `out_dir`; returns it."""
    import torch
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out_dir, shape.vocab_size)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=shape.vocab_size, hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size, num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        max_position_embeddings=shape.max_position_embeddings,
        bos_token_id=0, eos_token_id=1, pad_token_id=2, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    cfg_path = out_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["torch_dtype"] = "bfloat16"
    cfg["dtype"] = "bfloat16"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return out_dir


def is_built(out_dir: Path) -> bool:
    return all((out_dir / name).exists() for name in ("config.json", "tokenizer.json", "model.safetensors"))


def ensure_tiny_model(model: Path | str) -> bool:
    """Build the project's tiny model at `model` when `model` is TINY_MODEL_DIR (relative: the
    current directory's, e.g. a node's copy of a Ray job's --working-dir, which leaves out the
    git-ignored models/) and it is not built there; True if it was built here. The build is
    seeded, so every node makes the same files (checked in tests/unit/tools), and goes to a new
    folder renamed into place, so processes of one node building at once leave one whole copy."""
    import shutil
    import tempfile

    path = Path(model)
    if path != TINY_MODEL_DIR or is_built(path):
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tiny-llama-", dir=path.parent))
    try:
        build_tiny_llama(staging / "m")
        try:
            (staging / "m").rename(path)
        except OSError:  # another process of this node placed it first
            if not is_built(path):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return True
