#!/usr/bin/env python
"""Convert a megatron-fixedcode checkpoint (saved under any TP/PP) to a Hugging Face directory.

    python tools/convert_checkpoint_to_hf.py --load CKPT_DIR --output HF_DIR [--table-free]

The llama block becomes LlamaForCausalLM (a fixed code as a frozen embed_tokens table that plain
transformers loads); the gpt_gelu block becomes GPTNeoXForCausalLM. See docs/export.md.
"""

import sys

from megatron_fixedcode.cli.convert_checkpoint_to_hf import main

if __name__ == "__main__":
    sys.exit(main())
