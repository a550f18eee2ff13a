# Shared launch logic of examples/pretrain_*.sh — sourced, not run. The caller sets
#   MFC_ROOT       repository root
#   RECIPE         recipe path relative to MFC_ROOT
#   RUN_NAME       names the default checkpoint/log directories
#   DEFAULT_NODES  the script's "#SBATCH --nodes" (used outside Slurm, for --dry-run)
# and calls `mfc_launch "$@"`. Arguments: `--dry-run` anywhere, every other one goes to the trainer
# after the recipe (so it overrides it).
#
# Environment (all optional unless marked):
#   DATA_PATH         trainer --data-path (--train-data-path when VALID_DATA_PATH is set): prefixes or "weight prefix" pairs, whitespace-separated (one per line works)
#                     (paper 2: the shard prefixes; required there, paper 1 expands its recipe's
#                     ${FINEWEB_PREFIX}/${COSMOPEDIA_PREFIX} instead)
#   VALID_DATA_PATH   trainer --valid-data-path, same form
#   DATA_MANIFEST     trainer --data-manifest: manifest.json of examples/preprocess_shards.sh (instead of
#                     DATA_PATH/VALID_DATA_PATH: train shards -> --train-data-path, valid -> --valid-data-path;
#                     replaces a recipe's data paths); several, whitespace-separated, for a blend with
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
#   EXIT_DURATION_MINS  trainer --exit-duration-in-mins (a second guard besides the signal: a stop by it requeues
#                     as after the time-limit signal, within MAX_REQUEUES)
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
#                     only for CPU runs (tests/launchers/test_slurm.py does).
#   MAX_REQUEUES      default 20: the job requeues itself after a time-limit checkpoint at most so often.
#                     Only the launcher's own requeues count (kept in $LOG_DIR/requeues-<job id>), not
#                     Slurm's (preemption, `scontrol requeue`, node failure). When the limit is reached
#                     before the end of training the job ends FAILED with exit code 3 and a last line
#                     "unfinished: ...", so that `--dependency=afterok` jobs (export, evaluation) do not run.
#   MAX_RESTARTS      default 3: in-job restarts per allocation. When a rank dies (or hangs: a collective
#                     times out after --distributed-timeout-minutes; under --enable-ft-package its rank monitor
#                     ends it), the elastic launcher restarts the whole worker group in the same allocation and
#                     it resumes from the newest complete checkpoint (persistent or non-persistent), at most
#                     MAX_RESTARTS times (its own count, beside MAX_REQUEUES). Not restarted: a user error (exit
#                     2), Megatron's exit 17, a step that failed again after a restart; the job ends FAILED with
#                     a line that says why. A node lost is cut out (slurm_relaunch.sh). 0: no in-job restart.
#   MIN_NODES         default 1: the fewest nodes a run may continue on after losing some (issue 62); the
#                     --dry-run line "# node counts that keep global batch ..." lists the counts from the job's
#                     size down to it on which the global batch still splits (recovery/node_plan.py)
#   ELASTIC_LAUNCHER  ft_launcher (nvidia-resiliency-ext's torchrun; the default where the package is
#                     installed: pip install '.[ft]') or torchrun (elastic restarts without the rank monitors)
#   FT_SECTION_TIMEOUTS  ft_launcher's section timeouts in seconds, for --enable-ft-package (default
#                     "setup:1800,step:600,checkpointing:1200"), and FT_OUT_OF_SECTION_TIMEOUT (default 1200)
#   VENV              virtualenv to activate (default $MFC_ROOT/.venv when no env is active)
#   NCCL_*            any NCCL setting you export wins over the defaults below
#
# List variables (DATA_PATH, VALID_DATA_PATH, DATA_MANIFEST, DATA_MANIFEST_WEIGHTS) split on any
# whitespace, newlines included (`ls ... | sed` output works as is); one that is set but empty is
# refused, and so is a path holding a space (it would be split in two). The dry run prints the counts.
#
# Signals (docs/SCALING.md, "Signals"):
#   - time limit: "#SBATCH --signal=B:USR1@300" sends USR1 to this shell 5 minutes before the limit. The
#     trap sends the trainer's --exit-signal (Megatron-LM's default SIGTERM) to the job steps (scancel
#     --signal: every process of the steps, not this shell), after writing $LOG_DIR/stop-<job id>, which a
#     rank started after that signal reads; the trainer finishes the step, checkpoints and exits 0, torchrun and srun
#     exit 0, and this shell requeues the job ("#SBATCH --requeue", at most MAX_REQUEUES times); the next
#     run resumes from CKPT_DIR. A checkpoint that fails (disk full, ...) does not requeue: the job ends
#     FAILED with the trainer's line last, and the last complete checkpoint stays the one that loads.
#   - scancel (SIGTERM to every process) cancels: the trainer checkpoints within KillWait and exits, and
#     nothing requeues, also when the cancel comes while a time-limit checkpoint is being written.
#     Preemption and `scontrol requeue` requeue through Slurm itself, not this shell.
#   - the trainer's last word: rank 0 writes $LOG_DIR/exit-<job id>.json (its exit code, its one-line
#     error, the step reached and the last step); torchrun exits 1 whatever its ranks returned, so this
#     shell prints that error last and exits with the trainer's code (2 for a user error).
#   - examples/slurm_node.sh makes torchrun and the node-log tee ignore TERM, USR1 and --exit-signal (torchrun would
#     exit 1 on TERM, a tee killed by it loses every later line); the trainer ranks handle them.
#   - a signal during start-up (before the first step: data, model, kernel build) ends the rank at once
#     with exit 0 and nothing checkpointed: the next run starts from the last checkpoint. The traps are set
#     first: a USR1 during this shell's checks requeues without starting the training, a TERM cancels.

# bash's own clock (no `date` child: a signal that kills the children of this shell would blank it)
mfc_log() { printf '[%(%F %T)T] %s\n' -1 "$*" >&2; }

mfc_die() { echo "error: $*" >&2; exit 2; }

mfc_on_usr1() {
    if ((MFC_CANCELLED)); then
        mfc_log "USR1 after a cancel: ignored (the job is cancelled, not requeued)"
        return
    fi
    MFC_REQUEUE=1
    if ((!MFC_STEP_STARTED)); then
        mfc_log "USR1: time limit near before the training started: nothing to checkpoint; requeueing without starting it"
        return
    fi
    # The stop file first: a rank that starts after the signal below (srun or torchrun still starting it)
    # reads it and exits at once (utils/exit_signals.py); the ranks already running get the signal.
    : >"$MFC_STOP_FILE" || mfc_log "cannot write $MFC_STOP_FILE: ranks not yet started will not see the stop"
    mfc_log "USR1: time limit near: asking the trainer to checkpoint and exit ($MFC_EXIT_SIGNAL to the job steps); then requeueing once that checkpoint is complete"
    scancel --signal="${MFC_EXIT_SIGNAL#SIG}" "$SLURM_JOB_ID" 2>/dev/null ||
        mfc_log "no job step to signal yet: its ranks read $MFC_STOP_FILE when they start"
}

mfc_on_term() {
    ((MFC_REQUEUED)) && return   # the TERM of our own `scontrol requeue`
    # A cancel wins over a requeue asked for by an earlier USR1 (its checkpoint may still be being written).
    MFC_CANCELLED=1 MFC_REQUEUE=0
    mfc_log "SIGTERM: cancelled or preempted: the trainer checkpoints and exits; not requeueing (Slurm requeues a preempted job itself)"
}

# $1: the trainer's exit record (JSON). Sets MFC_EXIT_CODE MFC_EXIT_STEP MFC_EXIT_LAST MFC_EXIT_STOPPED_BY
# MFC_EXIT_RERUN_NODES MFC_EXIT_ERROR, empty when the record is absent (a rank killed, a crash before the loop).
mfc_read_exit_record() {
    MFC_EXIT_CODE='' MFC_EXIT_STEP='' MFC_EXIT_LAST='' MFC_EXIT_STOPPED_BY='' MFC_EXIT_RERUN_NODES='' MFC_EXIT_ERROR=''
    [[ -s $1 ]] || return 0
    local fields
    # fields joined by the unit separator: unlike a tab, read keeps an empty field between two of them
    fields=$(python -c 'import json, sys
r = json.load(open(sys.argv[1]))
r["rerun_nodes"] = ", ".join(r.get("rerun_nodes") or ())
print(*("" if r.get(k) is None else r[k] for k in ("code", "step", "max_steps", "stopped_by", "rerun_nodes")), sep="\x1f")
print(r.get("error") or "")' "$1" 2>/dev/null) || return 0
    IFS=$'\x1f' read -r MFC_EXIT_CODE MFC_EXIT_STEP MFC_EXIT_LAST MFC_EXIT_STOPPED_BY MFC_EXIT_RERUN_NODES <<<"${fields%%$'\n'*}"
    [[ $fields == *$'\n'* ]] && MFC_EXIT_ERROR=${fields#*$'\n'}
    return 0
}

# The attempts' record (recovery/attempts.py): the goodput and, when the in-job restarts end the job, why.
mfc_attempts_summary() {
    [[ -s ${MFC_ATTEMPTS_FILE:-} ]] || return 0
    python -m megatron_fixedcode.cli.attempts_summary "$MFC_ATTEMPTS_FILE" --max-restarts "${MAX_RESTARTS:-3}" >&2 || true
}

# After srun: requeue only after a time-limit checkpoint that completed (or the rerun state machine's exit 16),
# within MAX_REQUEUES of the launcher's own requeues; a cancel wins. $1 srun's exit code, $2 job id, $3 checkpoint dir, $4 log dir.
mfc_finish() {
    local rc=$1 job_id=$2 ckpt_dir=$3 log_dir=$4
    local counter=$log_dir/requeues-$job_id max=${MAX_REQUEUES:-20} used
    # rank 0 killed (or its node lost) in the attempt that ended the job left no last word: written here from the
    # attempts' record (code 1, the step, what failed), not srun's 128+signal, which reads as a cancel
    if ((rc != 0)) && [[ ! -s $log_dir/exit-$job_id.json && -s ${MFC_ATTEMPTS_FILE:-} ]] && ((!MFC_CANCELLED)); then
        python -m megatron_fixedcode.cli.attempts_summary "$MFC_ATTEMPTS_FILE" --max-restarts "${MAX_RESTARTS:-3}" \
            --lost-exit-record "$log_dir/exit-$job_id.json" --launcher-code "$rc" >/dev/null 2>&1 || true
    fi
    mfc_read_exit_record "$log_dir/exit-$job_id.json"
    [[ -n $MFC_EXIT_CODE && $MFC_EXIT_CODE != 0 ]] && rc=$MFC_EXIT_CODE   # torchrun says 1 whatever the ranks returned
    # the run ended cleanly (rank 0's last word: finished, or stopped as asked) though srun did not say 0 (a node's
    # launcher agent lost while its ranks went on): the job's state is what the run did, so that afterok dependants run
    if ((rc != 0)) && [[ $MFC_EXIT_CODE == 0 && -n $MFC_EXIT_STEP && -n $MFC_EXIT_LAST ]]; then
        if ((MFC_EXIT_STEP >= MFC_EXIT_LAST)); then
            mfc_log "srun exited with code $rc, but the training finished at step $MFC_EXIT_STEP of $MFC_EXIT_LAST (its exit record, code 0): the job completed"
            rc=0
        elif [[ -n $MFC_EXIT_STOPPED_BY ]]; then
            mfc_log "srun exited with code $rc, but the training stopped cleanly at step $MFC_EXIT_STEP of $MFC_EXIT_LAST ($MFC_EXIT_STOPPED_BY; its exit record, code 0)"
            rc=0
        fi
    fi
    mfc_attempts_summary
    if ((MFC_CANCELLED)); then
        mfc_log "training exited with code $rc (cancelled: not requeued)"
        exit "$rc"
    fi
    if ((rc == 16)); then   # Megatron's rerun state machine saved a checkpoint and asks for a resume (a fault
        mfc_log "training exited with code 16 at step ${MFC_EXIT_STEP:-?}: the rerun state machine asks to resume from its checkpoint on another GPU than ${MFC_EXIT_RERUN_NODES:-the one that saw the fault} (step $((${MFC_EXIT_STEP:-0} + 1)) to re-run, to tell a transient fault from a persistent one)"
        MFC_REQUEUE=1 rc=0  # to tell apart); 17 (the fault reproduced) and others end the job
    fi
    if ((rc == 0 && !MFC_REQUEUE)); then   # the trainer stopped itself before its last step
        case $MFC_EXIT_STOPPED_BY in
        --exit-duration-in-mins)   # EXIT_DURATION_MINS: the time-limit guard, handled as the time-limit signal
            mfc_log "training stopped at step $MFC_EXIT_STEP of $MFC_EXIT_LAST by --exit-duration-in-mins: requeueing as after a time-limit checkpoint"
            MFC_REQUEUE=1 ;;
        --exit-interval)
            mfc_log "training stopped at step $MFC_EXIT_STEP of $MFC_EXIT_LAST by --exit-interval, as asked: not requeued; submit the same command without it to continue" ;;
        signal)
            mfc_log "training exited with code 0"
            echo "unfinished: the trainer stopped at step $MFC_EXIT_STEP of $MFC_EXIT_LAST on a signal sent to the job step, not through this launcher (neither a time-limit USR1 nor a cancel): not requeued; the checkpoint in $ckpt_dir is complete: submit the same command again to continue" >&2
            exit 3 ;;
        esac
    fi
    if ((MFC_REQUEUE)); then
        if ((rc != 0)); then
            mfc_log "the time-limit checkpoint did not complete (training exited with code $rc): not requeueing; the last complete checkpoint in $ckpt_dir stays the one that loads"
            [[ -n $MFC_EXIT_ERROR ]] && echo "error: $MFC_EXIT_ERROR" >&2
            exit "$rc"
        fi
        if [[ -n $MFC_EXIT_STEP && -n $MFC_EXIT_LAST ]] && ((MFC_EXIT_STEP >= MFC_EXIT_LAST)); then
            mfc_log "training exited with code 0: finished at step $MFC_EXIT_STEP of $MFC_EXIT_LAST, nothing to requeue"
            exit 0
        fi
        used=$(cat "$counter" 2>/dev/null || echo 0)
        [[ $used =~ ^[0-9]+$ ]] || used=0
        if ((used < max)); then
            { echo $((used + 1)) >"$counter.tmp" && mv -f "$counter.tmp" "$counter"; } 2>/dev/null ||
                mfc_log "cannot record the requeue count in $counter (disk full?): MAX_REQUEUES is not enforced until it can be"
            if ((MFC_CANCELLED)); then   # a cancel that came while the exit record was read wins
                mfc_log "training exited with code 0 (cancelled: not requeued)"
                exit 0
            fi
            mfc_log "requeueing job $job_id (the launcher's requeue $((used + 1)) of MAX_REQUEUES=$max); the next run resumes from $ckpt_dir"
            MFC_REQUEUED=1
            scontrol requeue "$job_id"
            mfc_log "training exited with code 0"
            exit 0
        fi
        mfc_log "training exited with code 0"
        if [[ $MFC_EXIT_STOPPED_BY == "rerun state machine" ]]; then
            local host=${MFC_EXIT_RERUN_NODES%% *}
            echo "unfinished: the rerun state machine stopped the job at step ${MFC_EXIT_STEP:-?} of ${MFC_EXIT_LAST:-?} (exit 16) to re-run step $((${MFC_EXIT_STEP:-0} + 1)) on another GPU than ${MFC_EXIT_RERUN_NODES:-the one that saw the fault}, and MAX_REQUEUES=$max requeues of its own are used up; the checkpoint in $ckpt_dir holds the re-run: submit the same command again on other nodes (sbatch --exclude=${host:-NODE}) so that it can tell a transient fault from a persistent one" >&2
            exit 3
        fi
        echo "unfinished: the job stopped at step ${MFC_EXIT_STEP:-?} of ${MFC_EXIT_LAST:-?} after MAX_REQUEUES=$max requeues of its own; the checkpoint in $ckpt_dir is complete: continue the run by submitting the same command again (it resumes there), with a larger MAX_REQUEUES to let it requeue more" >&2
        exit 3
    fi
    mfc_log "training exited with code $rc"
    if ((rc != 0)) && [[ -n $MFC_EXIT_ERROR ]]; then
        echo "error: $MFC_EXIT_ERROR" >&2   # the trainer's one line, last, after torchrun's traceback
    fi
    exit "$rc"
}

# $1: a list variable's name. Sets MFC_ITEMS to its words (any whitespace, newlines included; no globbing).
# Refuses a variable that is set but holds nothing, and a path holding a space (split in two here): two or more
# neighbouring words that name a path on disk when joined by a space, whether or not the first exists alone.
mfc_list() {
    local name=$1 value=${!1} i j joined
    MFC_ITEMS=()
    read -r -d '' -a MFC_ITEMS <<<"$value" || true
    ((${#MFC_ITEMS[@]})) || mfc_die "$name is set but holds no path (an empty glob?): unset it or give at least one"
    for ((i = 0; i < ${#MFC_ITEMS[@]}; i++)); do
        joined=${MFC_ITEMS[i]}   # also when this first half exists on its own
        for ((j = i + 1; j < ${#MFC_ITEMS[@]} && j < i + 8; j++)); do
            joined+=" ${MFC_ITEMS[j]}"
            if [[ -e $joined || -e $joined.idx ]]; then
                mfc_die "$name: '$joined' holds a space, and list variables split on whitespace: rename it or link it from a path without one"
            fi
        done
    done
}

# $1: a list's words: how many are paths (not the numbers of "weight prefix" pairs)
mfc_count_paths() {
    local n=0 w
    for w in "$@"; do [[ $w =~ ^[0-9.eE+-]+$ ]] || n=$((n + 1)); done
    echo "$n"
}

# Before anything is started (a batch job that lacks its environment fails in its first second, in one
# line): every ${VAR} of the recipe (outside comments) must be exported, unless a flag given on the command
# line sets that key, or DATA_MANIFEST replaces the data paths.
mfc_check_env() {
    local line key var pat missing=() extra=" $* "
    while IFS= read -r line; do
        [[ $line =~ ^([a-z_0-9]+): ]] || continue
        key=${BASH_REMATCH[1]}
        [[ $extra == *" --${key//_/-} "* ]] && continue
        while [[ $line =~ \$\{([A-Za-z_][A-Za-z0-9_]*)\} ]]; do
            var=${BASH_REMATCH[1]}
            pat='${'"$var"'}'
            line=${line//"$pat"/}
            [[ -n ${!var:-} ]] && continue
            [[ ($key == data_path || $key == valid_data_path) && -n ${DATA_MANIFEST:-} ]] && continue
            [[ " ${missing[*]} " == *" $var "* ]] || missing+=("$var")
        done
    done < <(sed 's/#.*//' "$MFC_ROOT/$RECIPE")
    ((${#missing[@]} == 0)) || mfc_die "$RECIPE needs ${missing[*]} exported before sbatch (see the launcher's header and examples/slurm_common.sh)"
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
    # each restarted worker group builds its process group on a store of its own: on the agent's shared store
    # (torch >= 2.4's default) a restarted gloo group connects to the addresses of the attempt before it
    : "${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:=1}"
    export CUDA_DEVICE_MAX_CONNECTIONS TORCH_NCCL_ASYNC_ERROR_HANDLING NCCL_IB_TIMEOUT NCCL_IB_RETRY_CNT \
        NCCL_IB_QPS_PER_CONNECTION NCCL_DEBUG OMP_NUM_THREADS TORCH_ELASTIC_SHUTDOWN_TIMEOUT MFC_REQUIRE_CUDA \
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE
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

    if ((!dry_run)); then
        # From the first line: a signal during the checks below (seconds) is acted on, not fatal to this shell
        MFC_REQUEUE=0 MFC_REQUEUED=0 MFC_CANCELLED=0 MFC_STEP_STARTED=0 MFC_EXIT_SIGNAL=SIGTERM
        trap mfc_on_usr1 USR1
        trap mfc_on_term TERM
        mfc_check_env "${extra[@]}"
    fi

    # Slurm's values; outside Slurm (--dry-run on a login node) the script's own #SBATCH defaults.
    local num_nodes=${SLURM_NNODES:-${DEFAULT_NODES:-1}}
    local job_id=${SLURM_JOB_ID:-0}
    local gpus_per_node=${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-8}}
    local script_cpus=
    [[ -z ${SLURM_JOB_ID:-} && -f $0 ]] && script_cpus=$(sed -n 's/^#SBATCH --cpus-per-task=\([0-9]*\).*/\1/p' "$0" | head -n1)
    local cpus_per_task=${CPUS_PER_TASK:-${SLURM_CPUS_PER_TASK:-${script_cpus:-${SLURM_CPUS_ON_NODE:-$(nproc 2>/dev/null || echo 1)}}}}
    MFC_CPUS_PER_TASK=$cpus_per_task MFC_GPUS_PER_NODE=$gpus_per_node
    local master_addr=${MASTER_ADDR:-localhost}
    if [[ -n ${SLURM_JOB_NODELIST:-} ]] && command -v scontrol >/dev/null; then
        master_addr=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
    fi
    local master_port=${MASTER_PORT:-$((20000 + job_id % 20000))}
    local ckpt_dir=${CKPT_DIR:-$MFC_ROOT/runs/$RUN_NAME/checkpoints}
    local log_dir=${LOG_DIR:-$MFC_ROOT/runs/$RUN_NAME/logs}

    local -a trainer=(--config "$MFC_ROOT/$RECIPE") counts=()
    local var flag
    for var in DATA_PATH VALID_DATA_PATH DATA_MANIFEST DATA_MANIFEST_WEIGHTS; do
        [[ -n ${!var+set} ]] || continue
        mfc_list "$var"
        flag=--$(tr '[:upper:]_' '[:lower:]-' <<<"$var")
        # with VALID_DATA_PATH the training blend is --train-data-path (Megatron-LM: --data-path would win and split itself)
        [[ $var == DATA_PATH && -n ${VALID_DATA_PATH:-} ]] && flag=--train-data-path
        trainer+=("$flag" "${MFC_ITEMS[@]}")
        counts+=("$var=$(mfc_count_paths "${MFC_ITEMS[@]}")")
    done
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
    # --cpu-bind=none where the cluster binds tasks (a task plugin with affinity or cgroup); elsewhere srun
    # would print "cluster configuration lacks support for cpu binding" for every job. Asked inside the job
    # only: a login node's dry run need not wait on the controller (seconds when it is down).
    local -a bind=()
    if [[ -n ${SLURM_JOB_ID:-} ]] && command -v scontrol >/dev/null &&
        scontrol show config 2>/dev/null | grep -qE '^TaskPlugin +=.*(affinity|cgroup)'; then
        bind=(--cpu-bind=none)
    fi
    # The elastic launcher: ft_launcher where nvidia-resiliency-ext is installed (its rank monitors end a rank
    # that overstays a section under --enable-ft-package), else torchrun; both restart the worker group at most
    # MAX_RESTARTS times (c10d rendezvous: a restarted node rejoins the same round).
    local elastic=${ELASTIC_LAUNCHER:-}
    if [[ -z $elastic ]]; then
        elastic=torchrun
        (mfc_activate_venv && python -c "import nvidia_resiliency_ext.fault_tolerance" 2>/dev/null) && elastic=ft_launcher
    fi
    [[ $elastic == torchrun || $elastic == ft_launcher ]] || mfc_die "ELASTIC_LAUNCHER=$elastic: give ft_launcher or torchrun"
    [[ ${MAX_RESTARTS:-3} =~ ^[0-9]+$ ]] || mfc_die "MAX_RESTARTS=$MAX_RESTARTS: give a whole number (0: no in-job restart)"
    [[ ${MIN_NODES:-1} =~ ^[1-9][0-9]*$ ]] || mfc_die "MIN_NODES=$MIN_NODES: give a whole number of nodes, 1 or more"
    local -a elastic_args=(--max-restarts "${MAX_RESTARTS:-3}")
    if [[ $elastic == ft_launcher ]]; then
        # a restart stops the healthy ranks with TERM: their peers are gone, so 15 s (not 30) before the SIGKILL
        elastic_args+=(--ft-rank-section-timeouts "${FT_SECTION_TIMEOUTS:-setup:1800,step:600,checkpointing:1200}"
            --ft-rank-out-of-section-timeout "${FT_OUT_OF_SECTION_TIMEOUT:-1200}" --workers-stop-timeout 15)
        [[ ${MFC_REQUIRE_CUDA:-1} == 0 ]] && elastic_args+=(--ft-enable-nic-monitor false)   # CPU runs: no NICs to watch
    fi
    local -a launch=(srun --nodes "$num_nodes" --ntasks-per-node 1 --cpus-per-task="$cpus_per_task"
        --kill-on-bad-exit=1 "${bind[@]}"
        bash "$MFC_ROOT/examples/slurm_node.sh" "$elastic" --nnodes "$num_nodes" --nproc_per_node "$gpus_per_node"
        --rdzv_backend c10d --rdzv_endpoint "$master_addr:$master_port" --rdzv_id "$job_id" "${elastic_args[@]}"
        -m megatron_fixedcode.pretrain "${trainer[@]}")

    mfc_set_env
    mfc_activate_venv
    cd "$MFC_ROOT"
    local config
    # stdout: the resolved config (JSON); stderr: TE warning, layout and memory per GPU for this world size
    config=$(WORLD_SIZE=$((num_nodes * gpus_per_node)) python -m megatron_fixedcode.pretrain "${trainer[@]}" --dry-run) || exit 2
    if ((dry_run)); then
        echo "# nodes=$num_nodes gpus_per_node=$gpus_per_node cpus_per_task=$cpus_per_task job=$job_id recipe=$RECIPE"
        echo "# paths passed: ${counts[*]:-none, the recipe has them}"
        local node_counts   # where a relaunch on fewer nodes keeps the global batch (recovery/node_plan.py)
        node_counts=$(python -m megatron_fixedcode.recovery.node_plan --config-json - --gpus-per-node "$gpus_per_node" \
            --nodes "$num_nodes" --min-nodes "${MIN_NODES:-1}" <<<"$config") || node_counts="node counts: not computed"
        echo "# $node_counts"
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
    MFC_EXIT_SIGNAL=$(MFC_CONFIG_JSON=$config python -c 'import json, os, signal
print(signal.Signals(json.loads(os.environ["MFC_CONFIG_JSON"])["exit_signal"]).name)') || exit 2
    export MFC_EXIT_SIGNAL   # the trainer's --exit-signal: what the time-limit path sends, what slurm_node.sh ignores
    # what the trainer would refuse in its first seconds, refused here before any rank starts (one line, exit 2):
    # every data prefix an index, the tokenizer covering the data, a checkpoint directory holding this model
    WORLD_SIZE=$((num_nodes * gpus_per_node)) python -m megatron_fixedcode.training.preflight "${trainer[@]}" || exit 2
    mkdir -p "$ckpt_dir" "$log_dir"
    echo "$config" >"$log_dir/config-$job_id.json"
    mfc_log "job $job_id (restart ${SLURM_RESTART_COUNT:-0}): $num_nodes x $gpus_per_node GPUs, rendezvous" \
        "$master_addr:$master_port, checkpoints $ckpt_dir, logs $log_dir, paths passed: ${counts[*]:-none, from the recipe}"

    export MFC_NODE_LOG_DIR=$log_dir   # slurm_node.sh: $LOG_DIR/node<N>.log on every node
    export MFC_EXIT_RECORD=$log_dir/exit-$job_id.json   # the trainer's last word (rank 0), read by mfc_finish
    export MFC_STOP_FILE=$log_dir/stop-$job_id          # written on USR1, read by ranks as they start
    # the run's attempts, every allocation's (requeues, resubmissions): kept, so that goodput is the run's
    export MFC_ATTEMPTS_FILE=$log_dir/attempts.json   # (recovery/attempts.py; a run started at step 0 begins it anew)
    rm -f "$MFC_EXIT_RECORD" "$MFC_STOP_FILE"
    if ((MFC_CANCELLED)); then
        mfc_log "cancelled before the training started: not starting it"
        exit 0
    fi
    ((MFC_REQUEUE)) && mfc_finish 0 "$job_id" "$ckpt_dir" "$log_dir"
    MFC_STEP_STARTED=1 MFC_RELAUNCHES=0 MFC_LAUNCH=("${launch[@]}")
    local pid rc
    while :; do
        "${MFC_LAUNCH[@]}" &
        pid=$! rc=0
        # A trapped signal interrupts `wait`; keep waiting until srun itself has exited.
        while :; do
            wait "$pid" && rc=0 || rc=$?
            ((rc > 128)) && kill -0 "$pid" 2>/dev/null && continue
            break
        done
        # a node lost or gone bad: the step again on the nodes left, at the same global batch (slurm_relaunch.sh)
        mfc_relaunch_plan "$rc" "$job_id" "$log_dir" "$gpus_per_node" "$num_nodes" "$config" || break
        export MFC_RELAUNCHES=$((MFC_RELAUNCHES + 1))   # the relaunch's own MAX_RESTARTS (recovery/attempts.py)
        mfc_relaunch_command "${launch[@]}"
    done
    mfc_finish "$rc" "$job_id" "$ckpt_dir" "$log_dir"
}

source "$(dirname "${BASH_SOURCE[0]}")/slurm_relaunch.sh"
