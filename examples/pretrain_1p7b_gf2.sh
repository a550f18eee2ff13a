#!/usr/bin/env bash
# Paper 2, 1.7B-class, GF(2)-recoded fixed code (seed 12345): 2 nodes x 8 GPUs, 100B targets.
# Recipe: examples/recipes/paper2_1p7b_gf2.yaml
#   DATA_PATH="$(ls /data/fwe/*_train_text_document.idx | sed "s/.idx$//")" VALID_DATA_PATH=... TOKENIZER=... sbatch examples/pretrain_1p7b_gf2.sh   # from the repo root
#   bash examples/pretrain_1p7b_gf2.sh --dry-run [trainer flags]   # resolved torchrun command + config, no Slurm needed
# Extra arguments are trainer flags that override the recipe. Environment: examples/slurm_common.sh.
#SBATCH --job-name=mfc-1p7b-gf2
#SBATCH --nodes=2
#SBATCH --gpus-per-node=8
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=64
#SBATCH --exclusive
#SBATCH --time=24:00:00
#SBATCH --signal=B:USR1@300
#SBATCH --requeue
#SBATCH --no-kill
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%j.out
set -euo pipefail
RECIPE=examples/recipes/paper2_1p7b_gf2.yaml
RUN_NAME=${RUN_NAME:-paper2_1p7b_gf2}
DEFAULT_NODES=2
for MFC_ROOT in "${MFC_ROOT:-}" "$(dirname "$0")/.." "${SLURM_SUBMIT_DIR:-}"; do
    [[ -n $MFC_ROOT && -f $MFC_ROOT/examples/slurm_common.sh ]] && break
done
if [[ ! -f $MFC_ROOT/examples/slurm_common.sh ]]; then
    echo "error: examples/slurm_common.sh not found: submit from the repository root or set MFC_ROOT" >&2
    exit 2
fi
source "$MFC_ROOT/examples/slurm_common.sh"
mfc_launch "$@"
