#!/usr/bin/env python
"""Print every sample of global batch N: shard, document, window start and decoded text.

    python tools/inspect_batch.py --dataset-type document_windows --data-path PREFIX \
        --seq-length 2048 --global-batch-size 128 --seed 1234 --tokenizer-type HuggingFaceTokenizer \
        --tokenizer-model tokenizer.json --step 100
"""

import sys

from megatron_fixedcode.cli.inspect_batch import main

if __name__ == "__main__":
    sys.exit(main())
