"""`vllm-sweep build-model` and `build-conversations`: the project's own inputs (the tiny local
Llama the quickstart serves, synthetic ShareGPT conversations), their arguments and their work;
framework/cli.py only registers them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from framework.base.errors import ConfigError


def cmd_build_model(args: argparse.Namespace) -> int:
    from framework.tools.tiny_model import build_tiny_llama
    from framework.tools.tiny_model import is_built

    out = Path(args.out)
    if is_built(out) and not args.force:
        print(f"{out}: already built")
        return 0
    build_tiny_llama(out, seed=args.seed)
    print(f"{out}: tiny Llama built")
    return 0


def cmd_build_conversations(args: argparse.Namespace) -> int:
    import json

    from framework.load.sharegpt import sample_sharegpt_conversations

    low, _, high = args.turns.partition("-")
    if not (low.isdigit() and (high or low).isdigit() and 0 < int(low) <= int(high or low)):
        raise ConfigError("command line", "--turns", args.turns, "expected N or LOW-HIGH with "
                          "1 <= LOW <= HIGH")
    turns = (int(low), int(high or low))
    conversations = sample_sharegpt_conversations(args.num, args.seed, turns=turns)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(conversations, indent=1) + "\n")
    print(f"{out}: {len(conversations)} ShareGPT conversations of {args.turns} exchanges")
    return 0


def add_parsers(sub: Any) -> None:
    bm = sub.add_parser("build-model", help="build the tiny local Llama the quickstart serves")
    bm.add_argument("out", nargs="?", default="models/tiny-llama",
                    help="folder to write the model to (default: models/tiny-llama)")
    bm.add_argument("--seed", type=int, default=0,
                    help="seed of the random weights (default: 0)")
    bm.add_argument("--force", action="store_true", help="build again over an existing model")
    bm.set_defaults(fn=cmd_build_model)
    bc = sub.add_parser("build-conversations", help="write synthetic multi-turn ShareGPT "
                        "conversations (the sample a multi_turn workload can replay)")
    bc.add_argument("out", nargs="?", default="datasets/multi_turn_sample.json",
                    help="JSON file to write (default: datasets/multi_turn_sample.json)")
    bc.add_argument("--num", type=int, default=40, help="conversations (default: 40)")
    bc.add_argument("--turns", default="2-6", metavar="LOW-HIGH",
                    help="exchanges per conversation, uniform in [LOW, HIGH] (default: 2-6)")
    bc.add_argument("--seed", type=int, default=0, help="seed (default: 0)")
    bc.set_defaults(fn=cmd_build_conversations)
