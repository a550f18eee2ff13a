#!/usr/bin/env bash
# Set up .venv (CPU torch) and run the embedded default: tiny learned/binary/gf2 models trained
# for a few steps on 2 CPU ranks (gloo, data parallel). Extra arguments go to the quickstart.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
. .venv/bin/activate
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONWARNINGS=${PYTHONWARNINGS:-ignore}
exec torchrun --standalone --nproc_per_node "${NPROC:-2}" -m megatron_fixedcode.quickstart "$@"
