#!/usr/bin/env python
"""Evaluate checkpoints and exports.

    python tools/evaluate.py --load CKPT --text-files F [F ...] --json      # megatron checkpoint, any TP/PP
    python tools/evaluate.py --hf-model HF_DIR --text-files F --json         # the same protocol in transformers
    python tools/evaluate.py --hf-model HF_DIR --tasks local --output r.json # LM Evaluation Harness
    python tools/evaluate.py --compare a.json b.json ... --markdown cmp.md   # across models and seeds

See docs/evaluation.md for the protocol (document windows, EOD context, acc vs acc_norm).
"""

import sys

from megatron_fixedcode.cli.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
