#!/usr/bin/env python
"""Shard-parallel, resumable indexing (the steps examples/preprocess_shards.sh runs)."""

import sys

from megatron_fixedcode.cli.preprocess_shards import main

if __name__ == "__main__":
    sys.exit(main())
