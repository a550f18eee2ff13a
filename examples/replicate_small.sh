#!/usr/bin/env bash
# Small-scale replication on CPU: learned vs binary vs gf2 (3 seeds each) on the shared English
# corpus with the SmolLM2 tokenizer; writes docs/REPLICATION.md and docs/replication_loss.png.
#   bash examples/replicate_small.sh                 # the committed run (~20 min on 2 cores)
#   bash examples/replicate_small.sh --quick         # CI smoke run in a temporary directory
#   bash examples/replicate_small.sh --variants learned binary gf2 lowdim random --seeds 4 5 6
# Shared data: ../shared/data beside the checkout, or $MFC_SHARED_DATA.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python )}
exec "$PYTHON" -m megatron_fixedcode.replication "$@"
