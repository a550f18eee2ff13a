# Shared launch logic of examples/pretrain_*.sh — sourced, not run. The caller sets
#   MFC_ROOT       repository root
#   RECIPE         recipe path relative to MFC_ROOT
#   RUN_NAME       names the default checkpoint/log directories
#   DEFAULT_NODES  the script's "#SBATCH --nodes" (used outside Slurm, for --dry-run)
# and calls `mfc_launch "$@"`. Arguments: `--dry-run` anywhere, every other one goes to the trainer
# after the recipe (so it overrides it).
#
# Environment (all optional unless marked):
#   DATA_PATH         trainer --data-path (--train-data-path when VALID_DATA_PATH is set): prefixes or "weight prefix" pairs
#                     (paper 2: the shard prefixes; required there, paper 1 expands its recipe's
#                     ${FINEWEB_PREFIX}/${COSMOPEDIA_PREFIX} instead)
#   VALID_DATA_PATH   trainer --valid-data-path, same form
#   DATA_MANIFEST     trainer --data-manifest: manifest.json of examples/preprocess_shards.sh (instead of
#                     DATA_PATH/VALID_DATA_PATH: train shards -> --train-data-path, valid -> --valid-data-path;
#                     replaces a recipe's data paths); several, space-separated, for a blend with
#   DATA_MANIFEST_WEIGHTS  trainer --data-manifest-weights, one per manifest (paper 1: "0.8 0.2")
#   TOKENIZER         trainer --tokenizer-model (tokenizer.json, its directory, or a .model)
#   CKPT_DIR          --save and --load (default $MFC_ROOT/runs/$RUN_NAME/checkpoints): a requeued
#                     job resumes from the latest checkpoint there
#   LOG_DIR           metrics.jsonl, config-<job>.json, node<N>.log of every node (appended across
#                     requeues; default $MFC_ROOT/runs/$RUN_NAME/logs)
#   TENSORBOARD_DIR   trainer --tensorboard-dir (default $LOG_DIR/tensorboard; needs the tensorboard
#                     package, pip install '.[tb]'); set it empty to log without TensorBoard
#   SEED              trainer --seed
#   SAVE_INTERVAL     trainer --save-interval (default 1000)
#   EXIT_DURATION_MINS  trainer --exit-duration-in-mins (a second guard besides the signal)
#   WANDB_PROJECT     trainer --wandb-project
#   GPUS_PER_NODE     default $SLURM_GPUS_ON_NODE, else 8;  MASTER_PORT  default 20000 + job id mod 20000
#   CPUS_PER_TASK     srun --cpus-per-task of the one task per node (torchrun and its GPUS_PER_NODE workers):
#                     default $SLURM_CPUS_PER_TASK (the script's #SBATCH --cpus-per-task), else
#                     $SLURM_CPUS_ON_NODE, else this machine's cores. Passed explicitly because srun no
#                     longer inherits sbatch's --cpus-per-task (Slurm >= 22.05): without it the step gets
#                     one CPU per task and all 8 ranks and their data workers share it.
#                     OMP_NUM_THREADS defaults to CPUS_PER_TASK / GPUS_PER_NODE.
#   MFC_REQUIRE_CUDA  exported to the trainer, default 1: a rank that sees no CUDA GPU refuses to start
#                     (exit before any model or data is built) instead of training on CPU. Set it to 0
#                     only for CPU rehearsals (examples/rehearse_multinode.sh does).
#   MAX_REQUEUES      default 20: the job requeues itself after a time-limit checkpoint at most so often
#   VENV              virtualenv to activate (default $MFC_ROOT/.venv when no env is active)
#   NCCL_*            any NCCL setting you export wins over the defaults below
#
# Preemption and time limits: "#SBATCH --signal=B:USR1@300" sends USR1 to this shell 5 minutes
# before the limit. The trap forwards SIGTERM to the job steps (scancel --signal=TERM, which
# leaves this shell alone); torchrun passes it to its workers and waits TORCH_ELASTIC_SHUTDOWN_TIMEOUT
# seconds (torch >= 2.9; older torch waits 30 s) while the trainer (--exit-signal-handler) finishes
# the step, checkpoints and exits. This shell then requeues the job ("#SBATCH --requeue"), and the
# next run resumes from CKPT_DIR. A SIGTERM from Slurm itself (preemption, scancel) reaches the
# steps directly; the shell only records it and waits.

mfc_log() { echo "[$(date '+%F %T')] $*" >&2; }

mfc_die() { echo "error: $*" >&2; exit 2; }

mfc_on_usr1() {
    MFC_REQUEUE=1
    mfc_log "USR1: time limit near: asking the trainer to checkpoint and exit (SIGTERM to the job steps)"
    scancel --signal=TERM "$SLURM_JOB_ID" || mfc_log "scancel failed"
}

mfc_on_term() {
    MFC_REQUEUE=1
    mfc_log "SIGTERM: preempted or cancelled: the trainer checkpoints and exits; waiting for it"
}

mfc_set_env() {
    # One rank per GPU; NCCL settings for InfiniBand clusters. Exported values win.
    : "${CUDA_DEVICE_MAX_CONNECTIONS:=1}"          # megatron: overlap TP comm with compute in order
    : "${TORCH_NCCL_ASYNC_ERROR_HANDLING:=1}"      # a failed collective kills the job instead of hanging
    : "${NCCL_IB_TIMEOUT:=22}"
    : "${NCCL_IB_RETRY_CNT:=7}"
    : "${NCCL_IB_QPS_PER_CONNECTION:=4}"
    : "${NCCL_DEBUG:=WARN}"
    : "${OMP_NUM_THREADS:=$((MFC_CPUS_PER_TASK / MFC_GPUS_PER_NODE > 0 ? MFC_CPUS_PER_TASK / MFC_GPUS_PER_NODE : 1))}"
    : "${MFC_REQUIRE_CUDA:=1}"                     # the trainer refuses to run without a visible GPU
    : "${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:=240}"     # seconds torchrun lets workers checkpoint on SIGTERM
    export CUDA_DEVICE_MAX_CONNECTIONS TORCH_NCCL_ASYNC_ERROR_HANDLING NCCL_IB_TIMEOUT NCCL_IB_RETRY_CNT \
        NCCL_IB_QPS_PER_CONNECTION NCCL_DEBUG OMP_NUM_THREADS TORCH_ELASTIC_SHUTDOWN_TIMEOUT MFC_REQUIRE_CUDA
}

mfc_activate_venv() {
    local venv=${VENV:-}
    if [[ -z $venv && -z ${VIRTUAL_ENV:-} && -f $MFC_ROOT/.venv/bin/activate ]]; then
        venv=$MFC_ROOT/.venv
    fi
    if [[ -n $venv ]]; then
        # shellcheck disable=SC1091
        source "$venv/bin/activate"
    fi
}

mfc_check_config() {
    # $1: resolved config JSON, $2: world size. Unexpanded ${VAR} and a global batch that the GPU
    # count cannot split are refused here, before any GPU process starts.
    MFC_CONFIG_JSON=$1 python - "$2" <<'EOF'
import json, os, re, sys
cfg, world = json.loads(os.environ["MFC_CONFIG_JSON"]), int(sys.argv[1])
unset = sorted({m for v in cfg.values() for s in (v if isinstance(v, list) else [v])
                if isinstance(s, str) for m in re.findall(r"\$\{?(\w+)", s)})
if unset:
    sys.exit(f"error: the config still holds unexpanded ${{VAR}}: export {', '.join(unset)} (see examples/slurm_common.sh)")
model_parallel = (cfg["tensor_model_parallel_size"] * cfg["pipeline_model_parallel_size"]
                  * cfg["context_parallel_size"])
if world % model_parallel:
    sys.exit(f"error: {world} GPUs are not a multiple of TP x PP x CP = {model_parallel}")
dp, mbs, gbs = world // model_parallel, cfg["micro_batch_size"], cfg["global_batch_size"]
if cfg.get("tensorboard_dir"):
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        sys.exit("error: --tensorboard-dir needs the tensorboard package: pip install '.[tb]', or export TENSORBOARD_DIR=")
if gbs is not None and gbs % (mbs * dp):
    sys.exit(f"error: global batch {gbs} is not divisible by micro batch {mbs} x data-parallel size {dp}: "
             f"use at most {gbs // mbs} data-parallel ranks, or change --micro-batch-size")
EOF
}

mfc_launch() {
    local dry_run=0 arg
    local -a extra=()
    for arg in "$@"; do
        if [[ $arg == --dry-run ]]; then dry_run=1; else extra+=("$arg"); fi
    done
    MFC_ROOT=$(cd "$MFC_ROOT" && pwd)
    if [[ ! -f $MFC_ROOT/$RECIPE ]]; then
        mfc_die "recipe $RECIPE not found; there are: $(cd "$MFC_ROOT/examples/recipes" && echo *.yaml)"
    fi

    # Slurm's values; outside Slurm (--dry-run on a laptop) the script's own defaults.
    local num_nodes=${SLURM_NNODES:-${DEFAULT_NODES:-1}}
    local job_id=${SLURM_JOB_ID:-0}
    local gpus_per_node=${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-8}}
    local cpus_per_task=${CPUS_PER_TASK:-${SLURM_CPUS_PER_TASK:-${SLURM_CPUS_ON_NODE:-$(nproc 2>/dev/null || echo 1)}}}
    MFC_CPUS_PER_TASK=$cpus_per_task MFC_GPUS_PER_NODE=$gpus_per_node
    local master_addr=${MASTER_ADDR:-localhost}
    if [[ -n ${SLURM_JOB_NODELIST:-} ]] && command -v scontrol >/dev/null; then
        master_addr=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
    fi
    local master_port=${MASTER_PORT:-$((20000 + job_id % 20000))}
    local ckpt_dir=${CKPT_DIR:-$MFC_ROOT/runs/$RUN_NAME/checkpoints}
    local log_dir=${LOG_DIR:-$MFC_ROOT/runs/$RUN_NAME/logs}

    local -a trainer=(--config "$MFC_ROOT/$RECIPE") items=()
    # With VALID_DATA_PATH the training blend is --train-data-path (Megatron-LM: --data-path would win and split itself)
    if [[ -n ${DATA_PATH:-} ]]; then
        read -r -a items <<<"$DATA_PATH"; trainer+=("--${VALID_DATA_PATH:+train-}data-path" "${items[@]}")
    fi
    if [[ -n ${VALID_DATA_PATH:-} ]]; then
        read -r -a items <<<"$VALID_DATA_PATH"; trainer+=(--valid-data-path "${items[@]}")
    fi
    if [[ -n ${DATA_MANIFEST:-} ]]; then read -r -a items <<<"$DATA_MANIFEST"; trainer+=(--data-manifest "${items[@]}"); fi
    if [[ -n ${DATA_MANIFEST_WEIGHTS:-} ]]; then
        read -r -a items <<<"$DATA_MANIFEST_WEIGHTS"; trainer+=(--data-manifest-weights "${items[@]}")
    fi
    [[ -n ${TOKENIZER:-} ]] && trainer+=(--tokenizer-model "$TOKENIZER")
    [[ -n ${SEED:-} ]] && trainer+=(--seed "$SEED")
    trainer+=(--save "$ckpt_dir" --load "$ckpt_dir" --save-interval "${SAVE_INTERVAL:-1000}" --exit-signal-handler
              --metrics-file "$log_dir/metrics.jsonl")
    local tensorboard_dir=${TENSORBOARD_DIR-$log_dir/tensorboard}
    [[ -n $tensorboard_dir ]] && trainer+=(--tensorboard-dir "$tensorboard_dir")
    [[ -n ${EXIT_DURATION_MINS:-} ]] && trainer+=(--exit-duration-in-mins "$EXIT_DURATION_MINS")
    [[ -n ${WANDB_PROJECT:-} ]] && trainer+=(--wandb-project "$WANDB_PROJECT")
    trainer+=("${extra[@]}")

    # One torchrun per node (examples/slurm_node.sh: per-node log, then exec); the global batch
    # comes from the recipe whatever the node count, the trainer derives gradient accumulation from it.
    local -a launch=(srun --nodes "$num_nodes" --ntasks-per-node 1 --cpus-per-task="$cpus_per_task"
        --kill-on-bad-exit=1 --cpu-bind=none
        bash "$MFC_ROOT/examples/slurm_node.sh" torchrun --nnodes "$num_nodes" --nproc_per_node "$gpus_per_node"
        --rdzv_backend c10d --rdzv_endpoint "$master_addr:$master_port" --rdzv_id "$job_id"
        -m megatron_fixedcode.pretrain "${trainer[@]}")

    mfc_set_env
    mfc_activate_venv
    cd "$MFC_ROOT"
    local config
    # stdout: the resolved config (JSON); stderr: TE warning, layout and memory per GPU for this world size
    config=$(WORLD_SIZE=$((num_nodes * gpus_per_node)) python -m megatron_fixedcode.pretrain "${trainer[@]}" --dry-run) || exit 2
    if ((dry_run)); then
        echo "# nodes=$num_nodes gpus_per_node=$gpus_per_node cpus_per_task=$cpus_per_task job=$job_id recipe=$RECIPE"
        echo "# env: CUDA_DEVICE_MAX_CONNECTIONS=$CUDA_DEVICE_MAX_CONNECTIONS" \
            "TORCH_NCCL_ASYNC_ERROR_HANDLING=$TORCH_NCCL_ASYNC_ERROR_HANDLING NCCL_IB_TIMEOUT=$NCCL_IB_TIMEOUT" \
            "TORCH_ELASTIC_SHUTDOWN_TIMEOUT=$TORCH_ELASTIC_SHUTDOWN_TIMEOUT OMP_NUM_THREADS=$OMP_NUM_THREADS" \
            "MFC_REQUIRE_CUDA=$MFC_REQUIRE_CUDA"
        echo "# command:"
        printf '%q ' "${launch[@]}"
        echo
        echo "# resolved config:"
        echo "$config"
        mfc_check_config "$config" $((num_nodes * gpus_per_node)) >&2 || echo "# (would be refused at launch)" >&2
        return 0
    fi

    [[ -n ${SLURM_JOB_ID:-} ]] || mfc_die "not inside a Slurm job: use sbatch, or --dry-run"
    mfc_check_config "$config" $((num_nodes * gpus_per_node)) || exit 2
    mkdir -p "$ckpt_dir" "$log_dir"
    echo "$config" >"$log_dir/config-$job_id.json"
    mfc_log "job $job_id (restart ${SLURM_RESTART_COUNT:-0}): $num_nodes x $gpus_per_node GPUs, rendezvous" \
        "$master_addr:$master_port, checkpoints $ckpt_dir, logs $log_dir"

    export MFC_NODE_LOG_DIR=$log_dir   # slurm_node.sh: $LOG_DIR/node<N>.log on every node
    MFC_REQUEUE=0
    trap mfc_on_usr1 USR1
    trap mfc_on_term TERM
    "${launch[@]}" &
    local pid=$! rc=0
    # A trapped signal interrupts `wait`; keep waiting until srun itself has exited.
    while :; do
        wait "$pid" && rc=0 || rc=$?
        ((rc > 128)) && kill -0 "$pid" 2>/dev/null && continue
        break
    done
    if ((MFC_REQUEUE)) && ((${SLURM_RESTART_COUNT:-0} < ${MAX_REQUEUES:-20})); then
        mfc_log "requeueing job $job_id; the next run resumes from $ckpt_dir"
        scontrol requeue "$job_id"
    fi
    mfc_log "training exited with code $rc"
    exit "$rc"
}
