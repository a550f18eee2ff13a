#!/usr/bin/env bash
# One node's share of a Slurm launch. `srun --ntasks-per-node 1` runs this once on every node of the
# allocation with the per-node command as arguments (torchrun ... -m megatron_fixedcode.pretrain ...,
# built by mfc_launch in examples/slurm_common.sh; examples/rehearse_multinode.sh runs the same path on
# one machine). It appends this node's output to $MFC_NODE_LOG_DIR/node<SLURM_NODEID>.log (still
# echoed to stdout, which Slurm collects into slurm-<job name>-<job id>.out) and then replaces itself
# with the command, so signals Slurm sends to the step (SIGTERM: preemption, scancel) reach torchrun.
set -euo pipefail
node=${SLURM_NODEID:-0}
if [[ -n ${MFC_NODE_LOG_DIR:-} ]]; then
    mkdir -p "$MFC_NODE_LOG_DIR"
    exec > >(exec tee -a "$MFC_NODE_LOG_DIR/node$node.log") 2>&1
fi
echo "[$(date '+%F %T')] node $node of ${SLURM_NNODES:-1} on $(hostname) (${SLURMD_NODENAME:-?}): task" \
    "${SLURM_PROCID:-0}, job ${SLURM_JOB_ID:-none}, restart ${SLURM_RESTART_COUNT:-0}: $*"
exec "$@"
