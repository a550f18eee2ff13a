#!/usr/bin/env python
"""Merge megatron-core .bin/.idx shards into one dataset (like Megatron-LM's merge_datasets.py)."""

import sys

from megatron_fixedcode.cli.merge_datasets import main

if __name__ == "__main__":
    sys.exit(main())
