#!/usr/bin/env bash
# Index hundreds of input shards in parallel as a Slurm array job, then write manifest.json.
#
#   bash examples/preprocess_shards.sh --input '/data/fineweb-edu-dedup/*.parquet' --output-dir /data/fwe_idx \
#       --tokenizer-model /models/smollm2 --shards-per-task 4 -- --id-key id --append-eod
#   bash examples/preprocess_shards.sh ... --dry-run     # the array plan and the sbatch commands, nothing submitted
#
# Run it on a login node (from the repository root or anywhere: it finds itself). It
#   1. plans: sorted shards -> array tasks of --shards-per-task shards (or --array-size tasks),
#      written to OUTPUT_DIR/plan.json (tools/preprocess_shards.py plan);
#   2. submits the array: task i runs `srun tools/preprocess_shards.py task` on one node, indexing
#      its shards one .bin/.idx pair per shard and split (byte-identical to tools/preprocess_data.py
#      on that shard), skipping shards that are already complete;
#   3. submits the manifest step (after all tasks, whatever their exit): tools/write_manifest.py,
#      which refuses while a shard is missing or failed.
# Re-running the same command after a failure or a killed task submits only the tasks with a shard
# that is not complete (--array=1,3), which index only what is missing.
# Any node count works, including 1: every array task is one single-node job step.
#
# Options:
#   --input DIR|GLOB ...       shards (.parquet, .jsonl, .jsonl.gz); several allowed; quote globs
#   --output-dir DIR           outputs, plan.json, manifest.json, logs/
#   --tokenizer-model PATH     tokenizer.json (or its directory) or a SentencePiece .model
#   --tokenizer-type TYPE      default HuggingFaceTokenizer
#   --vocab-file F --merge-file F   GPT-2's vocab.json and merges.txt (with --tokenizer-type GPT2BPETokenizer)
#   --shards-per-task N        | --array-size N (default: 4 shards per task)
#   --max-parallel N           at most N array tasks at once (sbatch --array=...%N)
#   --cpus-per-task N          default 16 (tokenizer threads of one task)
#   --time HH:MM:SS            per array task, default 04:00:00
#   --partition P, --account A passed to sbatch
#   --hold                     submit held (sbatch --hold; `scontrol release JOBID` starts a job)
#   --skip-failed              write the manifest without shards whose input is bad (listed as excluded)
#   --dry-run                  print the plan and the sbatch commands only
#   -- FLAGS                   tools/preprocess_data.py flags shaping the outputs (--id-key, --append-eod,
#                              --json-keys, --valid-fraction, --split-seed, --workers, ...)
# Environment: VENV (virtualenv to activate, default $MFC_ROOT/.venv when none is active), PYTHON.
set -euo pipefail

for MFC_ROOT in "${MFC_ROOT:-}" "$(dirname "$0")/.." "${SLURM_SUBMIT_DIR:-}"; do
    [[ -n $MFC_ROOT && -f $MFC_ROOT/tools/preprocess_shards.py ]] && break
done
[[ -f $MFC_ROOT/tools/preprocess_shards.py ]] || { echo "error: tools/preprocess_shards.py not found: set MFC_ROOT" >&2; exit 2; }
MFC_ROOT=$(cd "$MFC_ROOT" && pwd)
if [[ -z ${VIRTUAL_ENV:-} ]]; then
    venv=${VENV:-$MFC_ROOT/.venv}
    # shellcheck disable=SC1091
    [[ -f $venv/bin/activate ]] && source "$venv/bin/activate"
fi
PYTHON=${PYTHON:-python}
export PYTHONPATH=$MFC_ROOT${PYTHONPATH:+:$PYTHONPATH}

# --- inside Slurm: one array task, or the manifest step ------------------------------------------
case ${1:-} in
    --task)
        echo "[$(date '+%F %T')] array job ${SLURM_ARRAY_JOB_ID:-?} task ${SLURM_ARRAY_TASK_ID:-?} on $(hostname)" >&2
        # the tokenizer's threads: this task's CPUs (not every core of a shared node)
        export RAYON_NUM_THREADS=${RAYON_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}
        exec srun --ntasks 1 --nodes 1 --cpus-per-task "${SLURM_CPUS_PER_TASK:-1}" \
            "$PYTHON" "$MFC_ROOT/tools/preprocess_shards.py" task --output-dir "$2" ;;
    --manifest)
        shift
        exec "$PYTHON" "$MFC_ROOT/tools/write_manifest.py" "$@" ;;
esac

# --- on the login node: plan and submit ----------------------------------------------------------
inputs=() output_dir= tokenizer=() tokenizer_type=HuggingFaceTokenizer per_task= array_size= max_parallel=
cpus=16 time_limit=04:00:00 dry_run=0 skip_failed=() sbatch_extra=() flags=()
while (($#)); do
    case $1 in
        --input) shift; while (($#)) && [[ $1 != --* ]]; do inputs+=("$1"); shift; done ;;
        --output-dir) output_dir=$2; shift 2 ;;
        --tokenizer-model|--vocab-file|--merge-file) tokenizer+=("$1" "$2"); shift 2 ;;
        --tokenizer-type) tokenizer_type=$2; shift 2 ;;
        --shards-per-task) per_task=$2; shift 2 ;;
        --array-size) array_size=$2; shift 2 ;;
        --max-parallel) max_parallel=$2; shift 2 ;;
        --cpus-per-task) cpus=$2; shift 2 ;;
        --time) time_limit=$2; shift 2 ;;
        --partition|--account) sbatch_extra+=("$1=$2"); shift 2 ;;
        --hold) sbatch_extra+=(--hold); shift ;;
        --skip-failed) skip_failed=(--skip-failed); shift ;;
        --dry-run) dry_run=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        --) shift; flags=("$@"); break ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
((${#inputs[@]})) || { echo "error: --input is required" >&2; exit 2; }
[[ -n $output_dir ]] || { echo "error: --output-dir is required" >&2; exit 2; }
((${#tokenizer[@]})) || { echo "error: --tokenizer-model (GPT2BPETokenizer: --vocab-file and --merge-file) is required" >&2; exit 2; }
[[ -n $per_task && -n $array_size ]] && { echo "error: give --shards-per-task or --array-size, not both" >&2; exit 2; }
grouping=(--shards-per-task "${per_task:-4}")
[[ -n $array_size ]] && grouping=(--array-size "$array_size")

plan=("$PYTHON" "$MFC_ROOT/tools/preprocess_shards.py" plan --input "${inputs[@]}" --output-dir "$output_dir"
      --tokenizer-type "$tokenizer_type" "${tokenizer[@]}" "${grouping[@]}" "${flags[@]}")
output_dir=$(realpath -m "$output_dir")
plan_text=$("${plan[@]}" $( ((dry_run)) && echo --dry-run)) || exit $?
echo "$plan_text"
num_tasks=$(sed -n 's/^# [0-9]* shards, \([0-9]*\) array tasks.*/\1/p' <<<"$plan_text")
todo=$(sed -n 's/^# tasks to run: \([^ ]*\) .*/\1/p' <<<"$plan_text")   # tasks with a shard not complete
array="$todo${max_parallel:+%$max_parallel}"
self=$MFC_ROOT/examples/preprocess_shards.sh
index_job=(sbatch --parsable --job-name=mfc-index --array="$array" --nodes=1 --ntasks=1 --cpus-per-task="$cpus"
           --time="$time_limit" --output="$output_dir/logs/index-%A_%a.out" --export=ALL,MFC_ROOT="$MFC_ROOT"
           "${sbatch_extra[@]}" "$self" --task "$output_dir")
manifest_job=(sbatch --parsable --job-name=mfc-manifest --dependency=afterany:JOBID --nodes=1 --ntasks=1
              --cpus-per-task=2 --time=01:00:00 --output="$output_dir/logs/manifest-%j.out"
              --export=ALL,MFC_ROOT="$MFC_ROOT" "${sbatch_extra[@]}" "$self" --manifest "$output_dir" "${skip_failed[@]}")
if [[ $todo == none ]]; then   # every shard complete: the manifest step alone
    index_job=()
    for i in "${!manifest_job[@]}"; do [[ ${manifest_job[i]} == --dependency=* ]] && unset 'manifest_job[i]'; done
    manifest_job=("${manifest_job[@]}")
fi
if ((dry_run)); then
    echo "# array: tasks $array of $num_tasks, 1 node x $cpus CPUs each; then the manifest step"
    ((${#index_job[@]})) && { printf '%q ' "${index_job[@]}"; echo; }
    printf '%q ' "${manifest_job[@]}"; echo
    exit 0
fi
mkdir -p "$output_dir/logs"
if ((${#index_job[@]})); then
    job=$("${index_job[@]}")
    job=${job%%;*}
    manifest_job=("${manifest_job[@]/JOBID/$job}")
    what="array job $job (tasks $todo of $num_tasks, logs $output_dir/logs/index-${job}_*.out)"
else
    what="no array job (every shard is complete)"
fi
manifest=$("${manifest_job[@]}")
echo "submitted: $what, manifest job ${manifest%%;*}"
echo "status:    $PYTHON tools/preprocess_shards.py status --output-dir $output_dir"
