#!/usr/bin/env bash
# The embedded default on a laptop (CPU, no network): a corpus from the Python stdlib's docstrings,
# a 4096-token BPE, a megatron index, then a tiny binary-code model and its learned-input control on
# 2 CPU ranks, with both validation perplexities side by side. Arguments go to
# megatron_fixedcode.quickstart_pipeline (--quick, --minutes M, --input FILES, --tokenizer-model PATH,
# --work-dir DIR, --variants ...; see --help).
#   bash examples/quickstart.sh --quick
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z ${VIRTUAL_ENV:-} && -f .venv/bin/activate ]]; then source .venv/bin/activate; fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONWARNINGS=${PYTHONWARNINGS:-ignore}
exec python -m megatron_fixedcode.quickstart_pipeline "$@"
