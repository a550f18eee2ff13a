#!/usr/bin/env bash
# The small-scale study on CPU (docs/REPLICATION.md): learned vs binary vs gf2 (3 seeds each) and the
# controls (norm-matched, centred, random, sinusoidal, lowdim, two more recodings), V = 4096 BPE.
# Resumable: each finished run is a JSON in docs/replication/; re-running trains only what is missing.
#   bash examples/replicate_small.sh                      # the study (hours on 2 cores; several sittings)
#   bash examples/replicate_small.sh --only binary:1      # one run of the plan
#   bash examples/replicate_small.sh --verify binary:1    # retrain one run, compare with its record
#   bash examples/replicate_small.sh --quick              # CI smoke run in a temporary directory
# Data: the directory $MFC_SHARED_DATA names, laid out as tests/assets (samples: tests/assets/SOURCES.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python )}
exec "$PYTHON" -m megatron_fixedcode.replication "$@"
