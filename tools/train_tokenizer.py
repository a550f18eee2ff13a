#!/usr/bin/env python
"""Train a byte-level BPE tokenizer.json on local text files (``<|endoftext|>`` is id 0)."""

import sys

from megatron_fixedcode.cli.train_tokenizer import main

if __name__ == "__main__":
    sys.exit(main())
