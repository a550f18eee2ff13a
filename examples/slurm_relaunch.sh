# A node that fails is cut out, not waited for — sourced by examples/slurm_common.sh, not run.
#
# The launchers submit with `#SBATCH --no-kill`: a node that fails leaves the job, and the job stays. After a
# job step (srun) failed, mfc_relaunch_plan asks megatron_fixedcode/recovery/usable_nodes.py which nodes are
# still usable (in the job and up in Slurm, less any node whose ranks failed at the last two attempts in a
# row) and, when one was cut out, the largest node count at which the recipe's global batch still splits
# (more microbatches per rank, not under MIN_NODES: recovery/node_plan.py). The step is then launched again
# on those nodes, by Slurm and the elastic launcher as before; the trainer resumes from the newest
# persistent or global checkpoint on the new data-parallel size (a node-local one belongs to the old layout
# and is passed over with a line). When no smaller count works, the job is requeued (within MAX_REQUEUES) to
# come back at full size: Slurm does not schedule a DOWN node; it refuses to change a running job's ExcNodeList,
# so a node found bad that Slurm calls up can come back (the line says to resubmit with --exclude).
# Every requeue comes back at the job's full size: the run grows back there.

# $1 the failed step's exit code, $2 job id, $3 log dir, $4 GPUs per node, $5 the job's node count, $6 the
# resolved config (JSON). Returns 0 and sets MFC_RELAUNCH_* when the step should run again on fewer nodes.
mfc_relaunch_plan() {
    local rc=$1 job_id=$2 log_dir=$3 gpus_per_node=$4 nodes=$5 config=$6 lines
    ((rc != 0)) && ((!MFC_CANCELLED && !MFC_REQUEUE)) || return 1
    mfc_read_exit_record "$log_dir/exit-$job_id.json"
    # a user error, Megatron's rerun exits and a clean stop are the trainer's answers, not a node's fault
    case ${MFC_EXIT_CODE:-} in 0 | 2 | 16 | 17) return 1 ;; esac
    lines=$(python -m megatron_fixedcode.recovery.usable_nodes --job "$job_id" --attempts "$MFC_ATTEMPTS_FILE" \
        --config-json - --gpus-per-node "$gpus_per_node" --nodes "$nodes" --min-nodes "${MIN_NODES:-1}" \
        --batch-host "${SLURMD_NODENAME:-$(hostname -s)}" <<<"$config") || return 1
    eval "$lines"   # shell-quoted KEY=value lines (shlex.quote)
    [[ -n $MFC_CUT_OUT ]] && mfc_log "cut out: $MFC_CUT_OUT"
    if ((MFC_RELAUNCH)) && [[ $MFC_RELAUNCH_NODES == "${MFC_STEP_NODES:-}" ]]; then
        mfc_log "not continuing on fewer nodes: the step failed on the nodes it was relaunched on ($MFC_STEP_NODES)"
        return 1
    fi
    if ((MFC_RELAUNCH)); then
        MFC_STEP_NODES=$MFC_RELAUNCH_NODES
        # for the trainer: its attempts record and its log line at every logging interval (slurm_node.sh exports)
        export MFC_REDUCED_SIZE="$MFC_RELAUNCH_COUNT of $nodes nodes (data-parallel $MFC_RELAUNCH_DP)"
        export MFC_RELAUNCH_NOTE="cut out: $MFC_CUT_OUT; $nodes -> $MFC_RELAUNCH_COUNT nodes ($MFC_RELAUNCH_NODES),\
 data-parallel size $((MFC_RELAUNCH_DP * nodes / MFC_RELAUNCH_COUNT)) -> $MFC_RELAUNCH_DP,\
 $MFC_RELAUNCH_MICROBATCHES microbatches per rank"
        mfc_log "continuing on $MFC_RELAUNCH_COUNT of $nodes nodes ($MFC_RELAUNCH_NODES): data-parallel size" \
            "$MFC_RELAUNCH_DP, $MFC_RELAUNCH_MICROBATCHES microbatches per rank, the same global batch and samples"
        rm -f "$log_dir/exit-$job_id.json"   # the next step's last word
        return 0
    fi
    mfc_log "not continuing on fewer nodes: $MFC_RELAUNCH_WHY"
    if [[ -n $MFC_CUT_OUT_NODES && $MFC_RELAUNCH_WHY != *"batch host"* ]]; then
        # back to the queue, to come back at full size: within MAX_REQUEUES of the launcher's own requeues. Slurm
        # refuses ExcNodeList while the job runs: a node Slurm still calls up may be allocated again (a DOWN one not)
        local counter=$log_dir/requeues-$job_id used
        used=$(cat "$counter" 2>/dev/null || echo 0)
        [[ $used =~ ^[0-9]+$ ]] || used=0
        if ((used < ${MAX_REQUEUES:-20})); then
            echo $((used + 1)) >"$counter" 2>/dev/null || true
            mfc_log "requeueing job $job_id without the step's failed nodes ($MFC_CUT_OUT_NODES; the launcher's requeue" \
                "$((used + 1)) of MAX_REQUEUES=${MAX_REQUEUES:-20}): it resumes at full size; to keep a node out, resubmit" \
                "with sbatch --exclude=$MFC_CUT_OUT_NODES"
            MFC_REQUEUED=1
            scontrol requeue "$job_id"
            exit 0
        fi
    fi
    return 1
}

# $@: the job's launch command (srun ... slurm_node.sh LAUNCHER ... -m megatron_fixedcode.pretrain ...). Sets
# MFC_LAUNCH to it on MFC_RELAUNCH_NODES: srun's node count and list, the elastic launcher's node count, and a
# rendezvous of its own (host, port + $MFC_RELAUNCHES, id) so that no agent of the failed step joins it.
mfc_relaunch_command() {
    local arg prev= host port trainer=0
    MFC_LAUNCH=()
    for arg in "$@"; do
        ((trainer)) && MFC_LAUNCH+=("$arg") && continue   # the trainer's own flags: left as they are
        case $prev in
        # --ntasks too: srun would take the job's task count (SLURM_NTASKS) and refuse the step
        --nodes) MFC_LAUNCH+=("$MFC_RELAUNCH_COUNT" --ntasks "$MFC_RELAUNCH_COUNT" --nodelist "$MFC_RELAUNCH_NODES")
            prev= && continue ;;
        --nnodes) arg=$MFC_RELAUNCH_COUNT ;;
        --rdzv_endpoint) host=${arg%:*} port=${arg##*:} arg=${MFC_RENDEZVOUS_HOST:-$host}:$((port + MFC_RELAUNCHES)) ;;
        --rdzv_id) arg=$arg.$MFC_RELAUNCHES ;;
        esac
        MFC_LAUNCH+=("$arg")
        prev=$arg
        [[ $arg == -m ]] && trainer=1
    done
}
