#!/usr/bin/env python
"""Analyze a trained checkpoint on CPU: activation statistics by token across depth, layer ablation,
activation patching and linear probes; writes OUTPUT/analysis.json and PNG plots.

    python tools/analyze_model.py --load runs/replication/checkpoints/binary_s1 --output-dir runs/analysis/binary
"""

import sys

from megatron_fixedcode.cli.analyze_model import main

if __name__ == "__main__":
    sys.exit(main())
