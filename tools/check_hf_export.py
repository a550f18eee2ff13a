#!/usr/bin/env python
"""Check an existing Hugging Face export against the checkpoint it came from (exit 3 when it
does not match).

    python tools/check_hf_export.py --load CKPT_DIR --hf-dir HF_DIR [--report parity.json]
"""

import sys

from megatron_fixedcode.cli.check_hf_export import main

if __name__ == "__main__":
    sys.exit(main())
