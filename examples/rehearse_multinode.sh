#!/usr/bin/env bash
# Multi-node launch rehearsal on one machine, no Slurm needed: the launchers' real path
#   Slurm environment -> node list -> c10d rendezvous -> torchrun on every node -> the trainer
# with N "nodes" x 1 CPU process (gloo, DP = N), the tiny recipe, per-node logs, a USR1 near the
# "time limit" -> checkpoint -> requeue -> resume, and a check that the resumed run's losses equal
# an uninterrupted run's, bit for bit.
#
#   bash examples/rehearse_multinode.sh                      # 2 nodes; USR1 once step 3 is logged
#   bash examples/rehearse_multinode.sh --nodes 2 --stop-after 5 --resume-steps 4 --work-dir /tmp/rehearsal
#   bash examples/rehearse_multinode.sh -- --input-embedding gf2   # extra trainer flags after --
#
# What is real: examples/slurm_common.sh (mfc_launch: node list via `scontrol show hostnames`,
# MASTER_ADDR/PORT, the trainer command, the USR1/TERM traps and `scontrol requeue`),
# examples/slurm_node.sh on every node, torchrun's c10d rendezvous on 127.0.0.1, the trainer.
# What is emulated (shims in WORK/slurm-bin): `srun` starts the per-node command once per node
# concurrently, with SLURM_NODEID/SLURM_PROCID/SLURMD_NODENAME set as Slurm does and
# --kill-on-bad-exit; `scancel --signal=TERM` signals those node tasks; `scontrol` expands the
# node list (127.0.0.[1-N]: every "node" is a loopback address) and records requeues.
# The jobs run with MFC_REQUIRE_CUDA=0 (the launcher's default 1 makes a GPU-less rank refuse to start).
#
# The run is planned for 1000 steps (--train-iters 1000, so the LR schedule and the sample stream are
# fixed up front). The batch shell gets USR1 once --stop-after steps are logged; the trainer
# checkpoints at the end of the step it is in (step k, whenever the signal gets there) and the job
# requeues itself. The requeued job, and an uninterrupted job of the same run, then stop at step
# k + --resume-steps (--exit-interval), and their per-step losses, grad norms, LRs and validation
# losses are compared for steps 1 .. k + --resume-steps.
#
# Data: DATA_PATH / VALID_DATA_PATH / TOKENIZER if set (trainer --vocab-size via extra flags when
# there is no tokenizer), else the quickstart's stdlib corpus is built under WORK/data (~1 min).
# Exit status 0 when the resumed run matches the uninterrupted one.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
NODES=2 STOP_AFTER=3 RESUME_STEPS=3 PLANNED_STEPS=1000 WORK=
extra=()
while (($#)); do
    case $1 in
        --nodes) NODES=$2; shift 2 ;;
        --resume-steps) RESUME_STEPS=$2; shift 2 ;;
        --stop-after) STOP_AFTER=$2; shift 2 ;;
        --work-dir) WORK=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        --) shift; extra=("$@"); break ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
((NODES >= 2 && STOP_AFTER >= 1 && RESUME_STEPS >= 1)) || { echo "error: need --nodes >= 2, --stop-after >= 1, --resume-steps >= 1" >&2; exit 2; }
WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/mfc-rehearsal.XXXXXX")}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
log() { echo "[rehearsal $(date +%T)] $*" >&2; }
if [[ -z ${VIRTUAL_ENV:-} && -f $ROOT/.venv/bin/activate ]]; then source "$ROOT/.venv/bin/activate"; fi

# --- data -------------------------------------------------------------------------------------
if [[ -z ${DATA_PATH:-} ]]; then
    log "building the quickstart corpus under $WORK/data"
    python -m megatron_fixedcode.quickstart_pipeline --data-only --work-dir "$WORK/data" --corpus-mb 0.3 \
        --vocab-size 1024 --valid-fraction 0.2 >"$WORK/data.log" 2>&1 || { cat "$WORK/data.log" >&2; exit 1; }
    DATA_PATH=$WORK/data/data/corpus_train_text_document
    VALID_DATA_PATH=$WORK/data/data/corpus_valid_text_document
    TOKENIZER=$WORK/data/tokenizer/tokenizer.json
fi
export DATA_PATH VALID_DATA_PATH=${VALID_DATA_PATH:-} TOKENIZER=${TOKENIZER:-}

# --- the Slurm shims --------------------------------------------------------------------------
BIN=$WORK/slurm-bin
mkdir -p "$BIN"
cat >"$BIN/scontrol" <<'SH'
#!/usr/bin/env bash
# scontrol show hostnames LIST (prefix[a-b,c] and comma lists) | scontrol requeue JOB
if [[ $1 == show && $2 == hostnames ]]; then
    python3 - "$3" <<'PY'
import re, sys
hosts = []
for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", sys.argv[1]):
    m = re.fullmatch(r"(.*)\[(.*)\]", part)
    if not m:
        hosts.append(part); continue
    for r in m.group(2).split(","):
        lo, _, hi = r.partition("-")
        hosts += [f"{m.group(1)}{i:0{len(lo)}d}" for i in range(int(lo), int(hi or lo) + 1)]
sys.stdout.write("".join(h + "\n" for h in hosts))  # one write: `| head -n1` may close the pipe after it
PY
elif [[ $1 == requeue ]]; then
    echo "requeue $2" >>"$REHEARSAL_DIR/requeue.log"
else
    echo "scontrol shim: unsupported: $*" >&2; exit 1
fi
SH
cat >"$BIN/srun" <<'SH'
#!/usr/bin/env bash
# srun [options] CMD...: CMD once per node of the allocation, concurrently, as Slurm's task 0 of each node.
kill_on_bad_exit=0
while [[ $1 == -* ]]; do
    case $1 in
        --nodes|-N|--ntasks-per-node|--cpus-per-task|-c) shift 2 ;;
        --kill-on-bad-exit=1|-K) kill_on_bad_exit=1; shift ;;
        *) shift ;;
    esac
done
mapfile -t hosts < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
pids=()
for ((i = 0; i < SLURM_NNODES; i++)); do
    SLURM_NODEID=$i SLURM_PROCID=$i SLURM_LOCALID=0 SLURM_STEP_ID=0 SLURM_NTASKS=$SLURM_NNODES \
        SLURMD_NODENAME=${hosts[i]} "$@" &
    pids+=($!)
done
printf '%s\n' "${pids[@]}" >"$REHEARSAL_DIR/step.pids"
rc=0
for _ in "${pids[@]}"; do
    wait -n; r=$?
    if ((r != 0)); then
        ((rc == 0)) && rc=$r
        ((kill_on_bad_exit)) && kill -TERM "${pids[@]}" 2>/dev/null
    fi
done
exit "$rc"
SH
cat >"$BIN/scancel" <<'SH'
#!/usr/bin/env bash
# scancel --signal=SIG JOB: the signal to every task of the job's steps
sig=TERM
for a in "$@"; do [[ $a == --signal=* ]] && sig=${a#--signal=}; done
echo "scancel $*" >>"$REHEARSAL_DIR/scancel.log"
xargs -r kill -s "$sig" <"$REHEARSAL_DIR/step.pids" 2>/dev/null || true
SH
chmod +x "$BIN"/*

# The batch script: the same four lines as examples/pretrain_*.sh, with the tiny recipe.
cat >"$WORK/sbatch_tiny.sh" <<SH
#!/usr/bin/env bash
set -euo pipefail
RECIPE=examples/recipes/tiny_cpu.yaml RUN_NAME=rehearsal DEFAULT_NODES=$NODES MFC_ROOT=$ROOT
source "\$MFC_ROOT/examples/slurm_common.sh"
mfc_launch "\$@"
SH

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# pick_job_id [AVOID]: a job id whose launcher port (20000 + id mod 20000) is free now
pick_job_id() {
    local port
    while :; do
        port=$(free_port)
        ((port >= 20000 && port < 40000 && 900000 + port - 20000 != ${1:-0})) && break
    done
    echo $((900000 + port - 20000))
}

# job_env NAME JOB_ID: what Slurm sets for a batch job (and the launcher's environment variables)
job_env() {
    JOB_ID=$2
    JOB_DIR=$WORK/$1
    mkdir -p "$JOB_DIR"
    export REHEARSAL_DIR=$JOB_DIR PATH="$BIN:$PATH" SLURM_JOB_ID=$JOB_ID SLURM_NNODES=$NODES \
        SLURM_JOB_NUM_NODES=$NODES SLURM_JOB_NODELIST="127.0.0.[1-$NODES]" SLURM_GPUS_ON_NODE=1 \
        SLURM_RESTART_COUNT=0 SLURM_JOB_NAME=mfc-rehearsal CKPT_DIR=$JOB_DIR/checkpoints \
        LOG_DIR=$JOB_DIR/logs TENSORBOARD_DIR= SAVE_INTERVAL=100000 OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore \
        MFC_REQUIRE_CUDA=0 CPUS_PER_TASK=1
    unset MASTER_ADDR MASTER_PORT GPUS_PER_NODE
}

steps_logged() { if [[ -f $1 ]]; then grep -c '"step"' "$1" || true; else echo 0; fi; }

trainer_flags=(--train-iters "$PLANNED_STEPS" --log-interval 1 "${extra[@]}")

# --- job 1: interrupted by USR1 (Slurm's --signal=B:USR1@300), then requeued ------------------
job_env interrupted "$(pick_job_id)"
log "job $JOB_ID: $NODES nodes x 1 process, nodes 127.0.0.[1-$NODES], rendezvous 127.0.0.1:$((20000 + JOB_ID % 20000))"
bash "$WORK/sbatch_tiny.sh" "${trainer_flags[@]}" >>"$JOB_DIR/slurm-$JOB_ID.out" 2>&1 &
batch=$!
deadline=$((SECONDS + 300))
until (($(steps_logged "$LOG_DIR/metrics.jsonl") >= STOP_AFTER)); do
    kill -0 "$batch" 2>/dev/null || { tail -50 "$JOB_DIR/slurm-$JOB_ID.out" >&2; log "job ended before step $STOP_AFTER"; exit 1; }
    ((SECONDS < deadline)) || { kill -TERM "$batch"; log "no progress"; exit 1; }
    sleep 0.5
done
log "step $STOP_AFTER logged: USR1 to the batch shell (the time limit is near)"
kill -USR1 "$batch"
wait "$batch" || true
grep -q "requeue $JOB_ID" "$JOB_DIR/requeue.log" 2>/dev/null || { tail -50 "$JOB_DIR/slurm-$JOB_ID.out" >&2; log "the job did not requeue itself"; exit 1; }
saved=$(cat "$CKPT_DIR/latest_checkpointed_iteration.txt")
((saved < PLANNED_STEPS)) || { log "the run ended before the signal got there"; exit 1; }
STEPS=$((saved + RESUME_STEPS))
INTERRUPTED_LOGS=$LOG_DIR
interrupted_job=$JOB_ID
log "checkpoint at step $saved, requeue recorded; the requeued job (SLURM_RESTART_COUNT=1) and an" \
    "uninterrupted job of the same run start, both stop after step $STEPS"

# --- the reference: the same run, uninterrupted, as its own job, concurrently with the requeue -----
REFERENCE_DIR=$WORK/uninterrupted
(
    job_env uninterrupted "$(pick_job_id "$interrupted_job")"
    exec bash "$WORK/sbatch_tiny.sh" "${trainer_flags[@]}" --exit-interval "$STEPS" >>"$JOB_DIR/slurm-$JOB_ID.out" 2>&1
) &
reference=$!

export SLURM_RESTART_COUNT=1
bash "$WORK/sbatch_tiny.sh" "${trainer_flags[@]}" --exit-interval "$STEPS" >>"$JOB_DIR/slurm-$JOB_ID.out" 2>&1 \
    || { tail -50 "$JOB_DIR/slurm-$JOB_ID.out" >&2; log "the requeued job failed"; exit 1; }
wait "$reference" || { tail -50 "$REFERENCE_DIR/slurm-"*.out >&2; log "the reference job failed"; exit 1; }
LOG_DIR=$REFERENCE_DIR/logs

# --- compare ----------------------------------------------------------------------------------
python3 - "$INTERRUPTED_LOGS" "$LOG_DIR" "$NODES" "$saved" "$STEPS" <<'PY'
import json, pathlib, sys
interrupted, reference, nodes, saved, steps = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), *map(int, sys.argv[3:])
def records(d):
    out = {}
    for line in (d / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        out[r["step"]] = r  # a re-run step (none expected) would replace the earlier record
    return out
a, b = records(interrupted), records(reference)
keys = ("loss", "grad_norm", "lr", "tokens", "val_loss")
print(f"{'step':>4}  {'interrupted+resumed loss':>24}  {'uninterrupted loss':>20}  same")
bad = []
for step in range(1, steps + 1):
    ra, rb = a.get(step), b.get(step)
    same = ra is not None and rb is not None and all(ra.get(k) == rb.get(k) for k in keys)
    bad += [] if same else [step]
    mark = "resumed" if step == saved + 1 else ""
    print(f"{step:>4}  {ra['loss'] if ra else float('nan'):>24.12f}  {rb['loss'] if rb else float('nan'):>20.12f}  {'yes' if same else 'NO'} {mark}")
for d in (interrupted, reference):
    missing = [n for n in range(nodes) if not (d / f"node{n}.log").is_file() or not (d / f"node{n}.log").stat().st_size]
    if missing:
        sys.exit(f"no per-node log for node(s) {missing} in {d}")
if bad:
    sys.exit(f"steps {bad} differ between the resumed and the uninterrupted run")
print(f"identical: {steps} steps ({saved} before the requeue, {steps - saved} after); per-node logs in {interrupted}")
PY
log "work dir: $WORK"
