#!/usr/bin/env python
"""Write OUTPUT_DIR/manifest.json once every shard of a shard-parallel indexing is complete."""

import sys

from megatron_fixedcode.cli.write_manifest import main

if __name__ == "__main__":
    sys.exit(main())
