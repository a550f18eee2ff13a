#!/usr/bin/env python
"""Convert a Hugging Face Llama directory (ours or e.g. SmolLM2) to a megatron-fixedcode checkpoint.

    python tools/convert_hf_to_megatron.py --hf-dir HF_DIR --save CKPT_DIR
    torchrun --nproc_per_node 2 -m megatron_fixedcode.pretrain ... --load CKPT_DIR --finetune \
        --tensor-model-parallel-size 2

Written at TP=1/PP=1; it loads at any TP/PP (weights only: use --finetune). Our own exports
are recognized by config.json["fixed_code"] and verified against the code. See docs/export.md.
"""

import sys

from megatron_fixedcode.cli.convert_hf_to_megatron import main

if __name__ == "__main__":
    sys.exit(main())
