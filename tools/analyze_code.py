#!/usr/bin/env python
"""Print the properties of a fixed token code (K, rank, weights, collisions, fingerprint)."""

import sys

from megatron_fixedcode.cli.analyze_code import main

if __name__ == "__main__":
    sys.exit(main())
