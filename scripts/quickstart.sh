#!/usr/bin/env bash
# Set up .venv (CPU torch) and run the embedded default: a corpus built from the Python standard
# library's docstrings, a BPE tokenizer trained on it, an indexed train/valid split, then a tiny
# binary-code model and a learned-input control trained the same way (the same steps and LR schedule,
# chosen before training by a timed probe; no time cap cuts a run) on 2 CPU ranks, with their
# validation perplexities side by side. Extra arguments go to the pipeline (see --help):
#   --quick, --minutes M, --input FILES..., --tokenizer-model PATH, --variants ...
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
. .venv/bin/activate
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONWARNINGS=${PYTHONWARNINGS:-ignore}
exec python -m megatron_fixedcode.quickstart_pipeline "$@"
