#!/usr/bin/env bash
# The paper-2 study rehearsed on one machine, no Slurm needed: examples/paper2_study.sh runs its real
# job graph (index array -> manifest -> train-<v> -> export-<v> -> eval-<v> -> report) under shims
# for sbatch, sacct, srun and scontrol, with the tiny recipe, a few shards cut from the shared
# Gutenberg corpus, the local evaluation tasks (examples/eval) and one CPU rank per training.
#
#   bash examples/rehearse_study.sh                              # the whole study, to its report
#   bash examples/rehearse_study.sh --fail-once train-binary     # that job fails once; run 2 resumes
#   bash examples/rehearse_study.sh --work-dir /tmp/st --variants learned binary --stages index train
#
# The sbatch shim runs each job when it is submitted (the study submits in dependency order), in
# the foreground, and records its state for sacct: COMPLETED, FAILED, or CANCELLED when an
# afterok dependency did not complete (Slurm's --kill-on-invalid-dep=yes). --fail-once JOB makes
# the shim fail that job (index, manifest, train-<v>, export-<v>, eval-<v>, report) the first
# time it is submitted, without running it: its dependents are cancelled and the study stops
# short of its report. The rehearsal then runs the same command again, which must resubmit only
# what did not finish and leave every output that existed byte-identical (sha256 of every file
# of the study, except Slurm logs and job scripts, before and after). Exit status 0 when the
# study ends with its report and nothing finished changed.
#
# Environment: MFC_SHARED_DATA (default ../shared/data beside the repository): corpus/gutenberg,
# tokenizers/smollm2 and the eval/ files.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK= FAIL_ONCE= VARIANTS=(learned binary gf2) STEPS=4 STAGES=(index train export eval report)
while (($#)); do
    case $1 in
        --work-dir) WORK=$2; shift 2 ;;
        --fail-once) FAIL_ONCE=$2; shift 2 ;;
        --steps) STEPS=$2; shift 2 ;;
        --variants) shift; VARIANTS=(); while (($#)) && [[ $1 != --* ]]; do VARIANTS+=("$1"); shift; done ;;
        --stages) shift; STAGES=(); while (($#)) && [[ $1 != --* ]]; do STAGES+=("$1"); shift; done ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
SHARED=${MFC_SHARED_DATA:-$ROOT/../shared/data}
[[ -d $SHARED/corpus/gutenberg && -d $SHARED/tokenizers/smollm2 ]] || { echo "error: shared data not found at $SHARED (set MFC_SHARED_DATA)" >&2; exit 2; }
WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/mfc-study.XXXXXX")}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
log() { echo "[rehearse-study $(date +%T)] $*" >&2; }
if [[ -z ${VIRTUAL_ENV:-} && -f $ROOT/.venv/bin/activate ]]; then source "$ROOT/.venv/bin/activate"; fi

# --- a small corpus: 4 JSONL shards of Gutenberg paragraphs ------------------------------------
if [[ ! -d $WORK/corpus ]]; then
    python - "$SHARED/corpus/gutenberg" "$WORK/corpus" <<'PY'
import json, pathlib, re, sys
src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
paras = []
for p in sorted(src.glob("*.txt")):
    paras += [t.strip() for t in re.split(r"\n\s*\n", p.read_text(encoding="utf-8", errors="replace")) if len(t.strip()) > 200]
paras = paras[:1600]
out.mkdir(parents=True)
for s in range(4):
    with open(out / f"shard{s:02d}.jsonl", "w") as f:
        for i, t in enumerate(paras[s::4]):
            f.write(json.dumps({"id": f"{s}:{i}", "text": t}) + "\n")
PY
fi

# --- the Slurm shims --------------------------------------------------------------------------
BIN=$WORK/slurm-bin SHIM_DIR=$WORK/slurm-state
mkdir -p "$BIN" "$SHIM_DIR"
cat >"$BIN/sbatch" <<'SH'
#!/usr/bin/env bash
# sbatch shim: runs the batch script now, in the foreground (the study submits in dependency order);
# every task of --array one after another; --dependency=afterok:A:B (not all COMPLETED: the job is
# CANCELLED, as with --kill-on-invalid-dep=yes) or afterany; --output patterns %A %a %j (appended);
# --export=ALL,K=V. State per job in $SHIM_DIR/<id>.state for the sacct shim. Prints the job id.
array= dep= out=slurm-%j.out name= nodes=1 cpus=1
while [[ ${1:-} == -* ]]; do
    case $1 in
        --array=*) array=${1#--array=} ;;
        --dependency=*) dep=${1#--dependency=} ;;
        --output=*) out=${1#--output=} ;;
        --job-name=*) name=${1#--job-name=} ;;
        --nodes=*) nodes=${1#--nodes=} ;;
        --cpus-per-task=*) cpus=${1#--cpus-per-task=} ;;
        --export=*) for kv in $(tr , ' ' <<<"${1#--export=}"); do [[ $kv == *=* ]] && export "$kv"; done ;;
    esac
    shift
done
script=$1; shift
job=$(( $(cat "$SHIM_DIR/next_job" 2>/dev/null || echo "$SHIM_FIRST_JOB") + 1 )); echo "$job" >"$SHIM_DIR/next_job"
short=${name#mfc-study-}; short=${short#mfc-}
echo "$job $short $dep" >>"$SHIM_DIR/submitted.log"
state=COMPLETED
if [[ -n $dep ]]; then
    kind=${dep%%:*}
    for d in $(tr : ' ' <<<"${dep#*:}"); do
        s=$(cat "$SHIM_DIR/$d.state" 2>/dev/null || echo UNKNOWN)
        [[ $kind == afterok && $s != COMPLETED ]] && state=CANCELLED
    done
fi
if [[ $state == CANCELLED ]]; then
    :
elif [[ -n ${SHIM_FAIL_ONCE:-} && $short == "$SHIM_FAIL_ONCE" && ! -e $SHIM_DIR/failed-once-$short ]]; then
    touch "$SHIM_DIR/failed-once-$short"
    log=${out//%A/$job}; log=${log//%a/0}; log=${log//%j/$job}; mkdir -p "$(dirname "$log")"
    echo "sbatch shim: injected failure of $short (job $job)" >>"$log"
    state=FAILED
else
    tasks=(0)
    if [[ -n $array ]]; then range=${array%%\%*}; tasks=($(seq "${range%-*}" "${range#*-}")); fi
    for t in "${tasks[@]}"; do
        log=${out//%A/$job}; log=${log//%a/$t}; log=${log//%j/$job}; mkdir -p "$(dirname "$log")"
        (
            export SLURM_JOB_ID=$job SLURM_CPUS_PER_TASK=$cpus SLURM_NNODES=$nodes SLURM_JOB_NUM_NODES=$nodes \
                SLURM_JOB_NAME=$name SLURM_RESTART_COUNT=0
            [[ -n $array ]] && export SLURM_ARRAY_JOB_ID=$job SLURM_ARRAY_TASK_ID=$t
            bash "$script" "$@"
        ) >>"$log" 2>&1 </dev/null || state=FAILED
    done
fi
echo "$state" >"$SHIM_DIR/$job.state"
echo "$job"
SH
cat >"$BIN/sacct" <<'SH'
#!/usr/bin/env bash
# sacct shim: `sacct -n -X -P -j ID -o State` -> the state the sbatch shim recorded
while (($#)); do [[ $1 == -j ]] && id=$2; shift; done
cat "$SHIM_DIR/$id.state" 2>/dev/null || true
SH
cat >"$BIN/squeue" <<'SH'
#!/usr/bin/env bash
# squeue shim: nothing is ever queued (the sbatch shim runs every job at submission)
exit 0
SH
cat >"$BIN/srun" <<'SH'
#!/usr/bin/env bash
# srun shim: one node, one task: drop the options, run the command in place
while [[ ${1:-} == -* ]]; do
    case $1 in --nodes|-N|--ntasks|-n|--ntasks-per-node|--cpus-per-task|-c) shift 2 ;; *) shift ;; esac
done
exec "$@"
SH
cat >"$BIN/scontrol" <<'SH'
#!/usr/bin/env bash
# scontrol shim: requeues are recorded (no time limit is reached in this rehearsal)
echo "scontrol $*" >>"$SHIM_DIR/scontrol.log"
SH
chmod +x "$BIN"/*
first_job=$((100000 + RANDOM % 15000))   # the launcher's rendezvous port is 20000 + job id mod 20000
export PATH="$BIN:$PATH" SHIM_DIR SHIM_FIRST_JOB=${SHIM_FIRST_JOB:-$first_job} GPUS_PER_NODE=1 CPUS_PER_TASK=1 \
    MFC_REQUIRE_CUDA=0 OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore HF_DATASETS_CACHE=$WORK/hf_datasets \
    TOKENIZERS_PARALLELISM=false MFC_SHARED_DATA=$SHARED SAVE_INTERVAL=100000
unset MASTER_ADDR MASTER_PORT SLURM_JOB_ID SLURM_JOB_NODELIST

STUDY=$WORK/study
study=(bash "$ROOT/examples/paper2_study.sh" --study-dir "$STUDY" --input "$WORK"/corpus/*.jsonl
       --tokenizer-model "$SHARED/tokenizers/smollm2" --shards-per-task 2 --index-cpus 1 --max-parallel 0
       --index-flags "--id-key id --append-eod --valid-fraction 0.05 --split-seed 1234"
       --variants "${VARIANTS[@]}" --stages "${STAGES[@]}" --recipe examples/recipes/tiny_cpu.yaml --train-nodes 1 --gpus-per-node 0
       --cpus-per-task 1 --eval-tasks piqa_local,arc_easy_local,lambada_local,wikitext2_local --eval-limit 4
       --eval-batch-size 4 --eval-gpus 0
       -- --train-iters "$STEPS" --log-interval 1 --eval-interval 2 --eval-iters 1)

# sha256 of every file of the study but Slurm logs and job scripts (outputs only)
outputs() { (cd "$STUDY" 2>/dev/null && find . -type f ! -path './logs/*' ! -path './jobs/*' ! -path './data/logs/*' \
             ! -name '*.lock' ! -name study.json -print0 | sort -z | xargs -0 -r sha256sum) || true; }

log "run 1${FAIL_ONCE:+ (job $FAIL_ONCE fails once)}: study in $STUDY"
SHIM_FAIL_ONCE=$FAIL_ONCE "${study[@]}"
if [[ ! -f $STUDY/report/report.json && " ${STAGES[*]} " == *" report "* ]]; then
    outputs >"$WORK/outputs-run1.sha256"
    log "run 1 ended without a report ($(grep -c . "$WORK/outputs-run1.sha256") output files); run 2: the same command"
    echo "# run 2" >>"$SHIM_DIR/submitted.log"
    "${study[@]}"
    [[ -f $STUDY/report/report.json ]] || { log "run 2 ended without a report"; exit 1; }
    outputs >"$WORK/outputs-run2.sha256"
    changed=$(comm -23 <(sort "$WORK/outputs-run1.sha256") <(sort "$WORK/outputs-run2.sha256") | awk '{print $2}')
    [[ -z $changed ]] || { log "outputs of run 1 changed or vanished in run 2: $changed"; exit 1; }
    log "run 2 finished the study; all $(grep -c . "$WORK/outputs-run1.sha256") output files of run 1 are byte-identical"
fi
[[ -f $STUDY/report/report.md ]] && log "report: $STUDY/report/report.md"
log "jobs submitted: $SHIM_DIR/submitted.log"
