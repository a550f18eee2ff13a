#!/usr/bin/env bash
# Paper 1, 0.4B-class: VARIANT [LAYERS] on 1 node x 8 GPUs, 17.093B tokens per seed (gf2: stopped at 16.276B on the same schedule;
# `--lr-decay-iters 62089` shortens its cosine to end there instead, our option).
# Recipe: examples/recipes/paper1_0p4b_VARIANT[_L9|_L16].yaml
#   FINEWEB_PREFIX=... COSMOPEDIA_PREFIX=... TOKENIZER=... SEED=1 sbatch examples/pretrain_paper1.sh binary 9   # from the repo root
#   bash examples/pretrain_paper1.sh binary 9 --dry-run [trainer flags]   # resolved torchrun command + config, no Slurm needed
# Extra arguments are trainer flags that override the recipe. Environment: examples/slurm_common.sh.
#SBATCH --job-name=mfc-paper1
#SBATCH --nodes=1
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
# Positional: VARIANT (learned | binary | gf2) and optionally LAYERS (32 default; 9 or 16 for the
# matched-depth ablations, learned and binary). Seeds: SEED=1, 2, 3 (each its own RUN_NAME).
VARIANT=${1:-}
if [[ -z $VARIANT || $VARIANT == -* ]]; then
    echo "usage: $0 VARIANT [LAYERS] [--dry-run] [trainer flags]   (VARIANT: learned, binary, gf2)" >&2
    exit 2
fi
shift
LAYERS=32
if [[ ${1:-} =~ ^[0-9]+$ ]]; then LAYERS=$1; shift; fi
SUFFIX=$([[ $LAYERS == 32 ]] || echo "_L$LAYERS")
RECIPE=examples/recipes/paper1_0p4b_${VARIANT}${SUFFIX}.yaml
RUN_NAME=${RUN_NAME:-paper1_0p4b_${VARIANT}_L${LAYERS}_seed${SEED:-1234}}
DEFAULT_NODES=1
for MFC_ROOT in "${MFC_ROOT:-}" "$(dirname "$0")/.." "${SLURM_SUBMIT_DIR:-}"; do
    [[ -n $MFC_ROOT && -f $MFC_ROOT/examples/slurm_common.sh ]] && break
done
if [[ ! -f $MFC_ROOT/examples/slurm_common.sh ]]; then
    echo "error: examples/slurm_common.sh not found: submit from the repository root or set MFC_ROOT" >&2
    exit 2
fi
source "$MFC_ROOT/examples/slurm_common.sh"
mfc_launch "$@"
