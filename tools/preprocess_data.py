#!/usr/bin/env python
"""Index JSONL / JSONL.gz / Parquet into megatron-core .bin/.idx (Megatron-LM flag names).

Outputs {output_prefix}_{train,valid}_{key}_document.{bin,idx} and {output_prefix}_summary.json;
see docs/data.md.
"""

import sys

from megatron_fixedcode.cli.preprocess_data import main

if __name__ == "__main__":
    sys.exit(main())
