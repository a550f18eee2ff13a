"""What Megatron-LM's own parser resolves for many argument lists (tests/assets/megatron_reference.json,
written by tools/dev/megatron_reference.py), and where this parser deliberately differs."""

from __future__ import annotations

import json

from tests.helpers import ASSETS

REFERENCE = json.loads((ASSETS / "megatron_reference.json").read_text())

# The one place a resolved value deliberately differs from Megatron-LM's: dest -> why (docs/training.md's table).
DIFFERENT = {
    "micro_batch_size": "default 1 here, None (required) in Megatron-LM: usable without the flag",
    "tokenizer_type": "default HuggingFaceTokenizer here, None in Megatron-LM: usable without the flag",
    "dist_ckpt_optim_fully_reshardable": "on by default here: a resume on any layout keeps Adam's state",
}
