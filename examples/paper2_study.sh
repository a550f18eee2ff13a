#!/usr/bin/env bash
# Paper 2's whole study as one Slurm job graph, from a login node (docs/study.md):
#   index (array) -> manifest -> train-{learned,binary,gf2} -> export-<v> -> eval-<v> -> report
#
#   bash examples/paper2_study.sh --study-dir /data/study --input '/data/fineweb-edu-dedup/*.parquet' \
#       --tokenizer-model /models/smollm2 --dry-run        # the graph, its dependencies and commands
#   bash examples/paper2_study.sh --study-dir /data/study --input ... --tokenizer-model ...   # submit
#   bash examples/paper2_study.sh --study-dir /data/study --input ... --tokenizer-model ...   # again: continue
#
# Every option: --help. Trainer flags for every variant go after `--`. Re-running continues: stages
# whose outputs exist are not resubmitted, queued/running jobs are left alone, failed ones go again.
# Environment: VENV (virtualenv to activate, default $MFC_ROOT/.venv when none is active), PYTHON.
set -euo pipefail
for MFC_ROOT in "${MFC_ROOT:-}" "$(dirname "$0")/.." "${SLURM_SUBMIT_DIR:-}"; do
    [[ -n $MFC_ROOT && -f $MFC_ROOT/megatron_fixedcode/study/__main__.py ]] && break
done
[[ -f $MFC_ROOT/megatron_fixedcode/study/__main__.py ]] || { echo "error: megatron_fixedcode/study not found: set MFC_ROOT" >&2; exit 2; }
MFC_ROOT=$(cd "$MFC_ROOT" && pwd)
if [[ -z ${VIRTUAL_ENV:-} ]]; then
    venv=${VENV:-$MFC_ROOT/.venv}
    # shellcheck disable=SC1091
    [[ -f $venv/bin/activate ]] && source "$venv/bin/activate"
fi
export MFC_ROOT PYTHONPATH=$MFC_ROOT${PYTHONPATH:+:$PYTHONPATH}
exec "${PYTHON:-python}" -m megatron_fixedcode.study "$@"
