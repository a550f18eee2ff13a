#!/usr/bin/env python
"""Verify indexed-dataset shards completely before training on them."""

import sys

from megatron_fixedcode.cli.verify_dataset import main

if __name__ == "__main__":
    sys.exit(main())
