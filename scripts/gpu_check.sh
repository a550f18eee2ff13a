#!/usr/bin/env bash
# Every GPU check in one run, in under 8 minutes (install included) on one H100/H200, for whoever is lent a GPU:
#
# PREPARATION (once, on a machine with network; the lent GPU machine has none):
#   bash scripts/download_gpu_wheels.sh     # -> wheels/ (~31 MiB, checked against the 64 MiB carry), git-ignored
# then run it with the wheels carried next to the checkout (the device tool: carry ["wheels"]):
#   bash scripts/gpu_check.sh --dry-run     # here: the plan, the budgets, the carried size, the wiring
#   bash scripts/gpu_check.sh --out $OUT/gpu_check   # there
#
#   bash scripts/gpu_check.sh [--out DIR] [--wheels DIR] [--site DIR] [--work DIR] [--budget-s S] [--bench-layers N]
#                             [--dry-run] [--install-only] [--cpu-standin] [--help]
#
#   --out DIR        results: gpu_check.json + gpu_check.md, and every stage's own output: env.json/.log,
#                    install.log, compile*.log/.json, bench-<variant>.json/.log, ckpt.json/.log,
#                    pytest-gpu.xml/.log, stages.jsonl; default ./gpu_check_out (more than 8 files: on the
#                    lent machine, tar it into $OUT)
#   --wheels DIR     wheels to install from, offline (scripts/download_gpu_wheels.sh makes them on a
#                    machine with network; they travel with the checkout, <= 64 MiB); default ./wheels
#   --site DIR       where the wheels the machine lacks are installed (pip --target; put on PYTHONPATH);
#                    default ${TMPDIR:-/tmp}/mfc-gpu-site
#   --work DIR       bench data, checkpoints, the inductor and Triton caches; default ${TMPDIR:-/tmp}/mfc-gpu-check
#   --budget-s S     wall-clock limit of the whole check (default 480): a stage that would not fit in
#                    what is left is recorded as not_run instead of started
#   --bench-layers N layers of the paper-2 block in the bench:* stages (default 4 of its 24)
#   --dry-run        on any machine (CPU): print the plan (stages and their time budgets), the wheels it
#                    would install (name, version, size) and their total, and fail if the wheels are over
#                    64 MiB or the budgets over 480 s; then check the wiring (the files it would run, the
#                    helpers on toy inputs, the report writers on fake numbers)
#   --install-only   only the env and install stages (needs no GPU): how the offline install is tested on CPU
#   --cpu-standin    every stage's command as on the GPU, at toy size on CPU (gloo): what
#                    tests/repository/test_gpu_check.py runs, so that a typo in a stage cannot wait for a GPU to show
#
# Expects: one NVIDIA GPU, a python whose `import torch` gives a CUDA torch (PYTHON=..., else the first of
# python3, python that imports torch: on the lent H200 the image's own venv with torch 2.11 + CUDA 13,
# Python 3.12), no network, no megatron-core. No venv is made (a --system-site-packages venv of the
# base interpreter would hide a torch that lives in its own venv): only the wheels that python lacks
# are installed, into --site.
# NOT MEASURABLE HERE: Transformer Engine cannot travel (its CUDA wheels are far over the 64 MiB carry and
# transformer_engine_torch has no wheel at all), so TE layers, FP8 and context parallelism (TE attention)
# are out of reach of this check unless the machine already has TE; the bench runs megatron-core's local layers.
# Stages (scripts/gpu_check/plan.py holds the budgets; each stage runs under `timeout <budget>`):
#   env           which python, torch/CUDA/GPU, a C compiler + Python.h (torch.compile), megatron-core, TE/FP8 -> env.json
#   install       the manifest's wheels (scripts/gpu_check/wheels.txt: megatron-core 0.19.x + deps, pytest, ...)
#                 that python lacks, pip --no-index --no-deps --target SITE; its own numpy, packaging, ... kept;
#                 this checkout on PYTHONPATH; the import check; random-token data
#   compile       warm the inductor cache (TORCHINDUCTOR_CACHE_DIR under --work): 1 layer, 1 step in both
#                 precisions at once; without a C compiler or Python.h (or when this fails) the fusions are
#                 turned off for every later stage (--no-bias-swiglu-fusion --no-bias-dropout-fusion, and
#                 TORCHDYNAMO_DISABLE=1 for the tests) and the report says so
#   bench:*       the paper-2 recipe as written (h 2048, FFN 8192 SwiGLU, 32 heads, seq 2048, micro batch 8,
#                 distributed optimizer with overlap, recompute none, fusions on) at 4 of its 24 layers with
#                 local layers and the real trainer: binary, gf2 and learned in the recipe's
#                 fp32-autocast-bf16, and binary in --bf16: tokens/s, model TFLOP/s, MFU (over the dense BF16
#                 peak of the exact device name: 989.4 TFLOP/s H100/H200 SXM, 835.5 H100 NVL / H200 NVL,
#                 756.5 H100 PCIe), peak memory, the first step (compile), and the device of
#                 every parameter, buffer and batch tensor (all must be on CUDA: a CPU tensor fails the stage)
#   ckpt          the distributed checkpoint on the GPU: 4 steps saving at step 2, then load step 2 and redo
#                 steps 3-4: losses and grad norms bit-identical (110 s: two trainer starts, ~2.7 GB written,
#                 read and hashed)
#   ckpt:2ranks   the same on 2 ranks under torchrun (NCCL reduce-scatter/all-gather, fully parallel save and
#                 load) where 2 GPUs are; on one GPU not run: NCCL refuses two ranks on one device
#                 ("Duplicate GPU detected", ncclInvalidUsage; plan.py says why no workaround is used)
#   tests         pytest -m gpu on the files with GPU-marked tests (the TE ones skip, with the reason)
#   bench:te_autocast, bench:te, bench:te_fp8
#                 binary with TE layers: in the recipe's fp32-autocast-bf16 (first: the recipe's exact path),
#                 in --bf16, and FP8 hybrid, where TE imports, only in the time left
#   report        gpu_check.json + gpu_check.md; printed at the end
# Every stage is recorded as ok / failed / skipped / not_run with the reason; nothing is skipped silently,
# no stage's output is discarded. Exit status: 0 when no stage failed.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$PWD/gpu_check_out WHEELS=$PWD/wheels SITE=${TMPDIR:-/tmp}/mfc-gpu-site WORK=${TMPDIR:-/tmp}/mfc-gpu-check
BUDGET=480 LAYERS=4 DRY=0 INSTALL_ONLY=0 CPU_STANDIN=0
while (($#)); do
    case $1 in
        --out) OUT=$2; shift 2 ;;
        --wheels) WHEELS=$2; shift 2 ;;
        --site) SITE=$2; shift 2 ;;
        --work) WORK=$2; shift 2 ;;
        --budget-s) BUDGET=$2; shift 2 ;;
        --bench-layers) LAYERS=$2; shift 2 ;;
        --dry-run) DRY=1; shift ;;
        --install-only) INSTALL_ONLY=1; shift ;;
        --cpu-standin) CPU_STANDIN=1; shift ;;
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
mkdir -p "$OUT" "$SITE" || exit 2
OUT=$(cd "$OUT" && pwd) SITE=$(cd "$SITE" && pwd)
[[ -d $WHEELS ]] && WHEELS=$(cd "$WHEELS" && pwd)
HELPERS=$ROOT/scripts/gpu_check
NO_COMPILE_FLAGS="--no-bias-swiglu-fusion --no-bias-dropout-fusion"
START=$SECONDS
log() { echo "[gpu_check +$((SECONDS - START))s] $*" >&2; }
stage() { "$PY" "$HELPERS/report.py" stage "$OUT" "$@"; }
budget_of() { "$PY" "$HELPERS/plan.py" budget "$1"; }
gpu_test_files() { (cd "$ROOT" && grep -l "pytest.mark.gpu" tests/*/test_*.py); }
left() { echo $((BUDGET - (SECONDS - START))); }
# pick_python: the first of $PYTHON, python3, python whose `import torch` works (each try in python-probe.log)
pick_python() {
    local c
    : >"$OUT/python-probe.log"
    for c in ${PYTHON:-} python3 python; do
        command -v "$c" >/dev/null 2>&1 || { echo "$c: not on PATH" >>"$OUT/python-probe.log"; continue; }
        echo "--- $c ($(command -v "$c"))" >>"$OUT/python-probe.log"
        if "$c" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" \
                >>"$OUT/python-probe.log" 2>&1; then echo "$c"; return 0; fi
    done
    return 1
}
export PYTHONWARNINGS=ignore OMP_NUM_THREADS=8 PYTHONUNBUFFERED=1

if ((DRY)); then
    # --- the plan and the wiring, on any machine ---------------------------------------------------
    cd "$ROOT" || exit 2
    rm -f "$OUT"/stages.jsonl
    fail=0
    check() { local what=$1; shift; if "$@" >"$OUT/dry-run.log" 2>&1; then log "ok: $what"; else log "FAILED: $what"; cat "$OUT/dry-run.log" >&2; fail=1; fi; }
    [[ -n ${VIRTUAL_ENV:-} || ! -f $ROOT/.venv/bin/activate ]] || source "$ROOT/.venv/bin/activate"
    PY=python
    log "would: use the python whose torch imports (no venv), install only the wheels it lacks from $WHEELS into $SITE, write to $OUT"
    log "Transformer Engine cannot travel (wheels far over 64 MiB): TE, FP8 and CP are not measured unless the machine has TE"
    # The plan, the wheels and both limits: printed to stdout; over a limit fails the dry run.
    if "$PY" "$HELPERS/plan.py" show --wheels "$WHEELS"; then log "ok: wheels <= 64 MiB and stage budgets <= 480 s"
    else log "FAILED: the plan is over a limit (above)"; fail=1; fi
    files=$(gpu_test_files | tr '\n' ' ')
    log "GPU test files: $files"
    for f in $files; do check "$f exists" test -f "$ROOT/$f"; done
    for f in tests/models/test_te_parity.py tests/training/test_te_flags.py tests/models/test_gpu_te.py \
             tests/training/test_device_contract.py; do
        check "$f is among them" grep -qw "$f" <<<"$files"
    done
    check "pytest collects the GPU tests" "$PY" -m pytest -q -p no:cacheprovider --collect-only -m gpu $files
    for h in env_report bench report wheel_deps plan ckpt_roundtrip; do
        check "scripts/gpu_check/$h.py imports" "$PY" -c "import sys; sys.path.insert(0, '$HELPERS'); import $h"
    done
    check "install.sh parses" bash -n "$HELPERS/install.sh"
    check "env_report.py writes env.json" "$PY" "$HELPERS/env_report.py" --out "$OUT/env.json"
    check "bench.py: the trainer accepts the flags of every variant" "$PY" "$HELPERS/bench.py" --check
    check "bench.py: ... also with the fusions off" "$PY" "$HELPERS/bench.py" --check --no-compile-fusions
    check "wheel_deps.py runs" "$PY" "$HELPERS/wheel_deps.py" "$OUT"
    check "report writers on fake numbers" "$PY" "$HELPERS/report.py" fake "$OUT/fake"
    check "download_gpu_wheels.sh --help" bash "$ROOT/scripts/download_gpu_wheels.sh" --help
    ((fail)) && { log "dry run: problems above"; exit 1; }
    log "dry run ok: fake report in $OUT/fake/gpu_check.md (every stage's command on CPU: --cpu-standin)"
    exit 0
fi

cd "$ROOT" || exit 2
rm -f "$OUT"/stages.jsonl "$OUT"/bench-*.json "$OUT"/compile-*.json "$OUT"/ckpt.json "$OUT"/pytest-gpu.xml "$OUT"/env.json
mkdir -p "$WORK" || exit 2
failed=0
# The inductor/Triton caches: the compile stage fills them once, every later process reuses them.
export TORCHINDUCTOR_CACHE_DIR=$WORK/inductor TRITON_CACHE_DIR=$WORK/triton
export PYTHONPATH=$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}   # this checkout (no build) + the wheels the machine lacked
STANDIN=() FUSE=()
((CPU_STANDIN)) && STANDIN=(--cpu-standin)

# run_stage NAME LOG COMMAND...: under `timeout <budget>` with its output in LOG (or not_run when it
# would not fit in what is left); sets rc and t
run_stage() {
    local name=$1 logfile=$2; shift 2
    local b; b=$(budget_of "$name")
    t=$SECONDS
    if (($(left) < b)); then rc=125; stage "$name" not_run 0 "time budget: ${b}s needed, $(left)s of --budget-s $BUDGET left"; return; fi
    log "$name (budget ${b}s) -> ${logfile#"$OUT"/}"
    timeout --kill-after 5 "$b" "$@" >"$logfile" 2>&1
    rc=$?
}
# finish NAME LOG OK-DETAIL: record the stage from rc: ok, or failed with the reason (a timeout, or
# the exit status and the log's last line)
finish() {
    local name=$1 logfile=$2 detail=$3
    case $rc in
        125) ;;
        0) stage "$name" ok $((SECONDS - t)) "$detail" ;;
        124|137) stage "$name" failed $((SECONDS - t)) "timed out after $(budget_of "$name")s (${logfile#"$OUT"/}): $(last_line "$logfile")"; failed=1 ;;
        *) stage "$name" failed $((SECONDS - t)) "exit $rc (${logfile#"$OUT"/}): $(last_line "$logfile")"; failed=1 ;;
    esac
}
last_line() { grep -v '^\s*$' "$1" 2>/dev/null | tail -1 | cut -c1-300; }
summary_of() { grep '^summary: ' "$1" 2>/dev/null | tail -1 | cut -c10-400; }  # a helper's own result line
skip_rest() {  # every stage after a fatal one: not_run, with the reason; then the report
    local s
    for s in $(all_stages); do grep -q "\"stage\": \"$s\"" "$OUT/stages.jsonl" 2>/dev/null || stage "$s" not_run 0 "$1"; done
    "$PY" "$HELPERS/report.py" write "$OUT" >/dev/null
    log "stopped: $1 ($OUT/gpu_check.md)"
    exit 1
}
all_stages() { "$PY" "$HELPERS/plan.py" stages; }
env_field() { "$PY" -c "import json,sys; e=json.load(open('$OUT/env.json')); print(eval(sys.argv[1], {}, {'e': e}))" "$1" 2>/dev/null; }

# --- env: which python, CUDA, compile readiness, TE -------------------------------------------------
if ! PY=$(pick_python); then
    PY=${PYTHON:-python3}
    stage env failed $((SECONDS - START)) "no python here imports torch (tried: ${PYTHON:-} python3 python; python-probe.log)"
    skip_rest "no python with torch"
fi
log "python: $PY ($(command -v "$PY"))"
run_stage env "$OUT/env.log" "$PY" "$HELPERS/env_report.py" --out "$OUT/env.json"
if ((rc != 0)); then
    finish env "$OUT/env.log" ""
    skip_rest "the env stage failed"
fi
cuda=$(env_field "int(bool(e.get('cuda_available')))")
torch_v=$(env_field "e.get('torch')")
compile_ready=$(env_field "int(e['compile']['ready'])")
compile_why=$(env_field "e['compile']['reason']")
pyver=$(env_field "e['python']")
desc="python $pyver ($(command -v "$PY")), torch $torch_v; $(env_field "e.get('gpu', 'no GPU')"); torch.compile: $compile_why"
[[ $pyver == 3.12* ]] || desc+=" (expected 3.12: the wheels may not match)"
if ((INSTALL_ONLY)); then
    stage env ok $((SECONDS - t)) "$desc (--install-only: no GPU needed)"
elif ((CPU_STANDIN)); then
    stage env ok $((SECONDS - t)) "$desc (--cpu-standin: the stages at toy size on CPU, no GPU needed)"
elif ((cuda != 1)); then
    stage env failed $((SECONDS - t)) "no CUDA GPU visible to $PY (torch $torch_v; env.json)"
    skip_rest "needs a CUDA GPU"
else
    stage env ok $((SECONDS - t)) "$desc"
fi

# --- install: only what the machine lacks, into SITE ------------------------------------------------
run_stage install "$OUT/install.log" bash "$HELPERS/install.sh" "$PY" "$WHEELS" "$SITE" "$OUT" "$WORK/bench-data" "${STANDIN[@]}"
finish install "$OUT/install.log" "$(last_line "$OUT/install.log")"
((rc == 0)) || skip_rest "install failed"
# env.json again, now with megatron-core (its output kept, after the first one's)
echo "--- after install ---" >>"$OUT/env.log"
timeout "$(budget_of env)" "$PY" "$HELPERS/env_report.py" --out "$OUT/env.json" >>"$OUT/env.log" 2>&1 \
    || log "env_report.py after install failed (env.log); env.json is the one before install"
((INSTALL_ONLY)) && { "$PY" "$HELPERS/report.py" write "$OUT" >/dev/null; log "--install-only: done"; exit $failed; }

# --- compile: warm the inductor cache, or turn the torch.compile fusions off --------------------------
NO_FUSE_WHY=""
if ((CPU_STANDIN == 0 && compile_ready != 1)); then
    NO_FUSE_WHY="torch.compile cannot build kernels here ($compile_why)"
    stage compile skipped 0 "$NO_FUSE_WHY: the fusions are off for every stage (${NO_COMPILE_FLAGS}; TORCHDYNAMO_DISABLE=1 for the tests)"
else
    run_stage compile "$OUT/compile.log" "$PY" "$HELPERS/bench.py" --warm --variant binary,binary_bf16 \
        --data-dir "$WORK/bench-data" --out "$OUT/compile-binary.json" "${STANDIN[@]}"
    detail="cold compile, 1 layer, both precisions at once: $(tr '\n' ';' <"$OUT/compile.log" | sed 's/;$//'); cache $TORCHINDUCTOR_CACHE_DIR"
    finish compile "$OUT/compile.log" "$detail"
    ((rc == 0 || rc == 125)) || NO_FUSE_WHY="the compile stage failed (compile.log)"
fi
if [[ -n $NO_FUSE_WHY ]]; then
    FUSE=(--no-compile-fusions)
    export TORCHDYNAMO_DISABLE=1
    log "fusions OFF from here on: $NO_FUSE_WHY ($NO_COMPILE_FLAGS, TORCHDYNAMO_DISABLE=1)"
fi
fusion_note() { [[ -n $NO_FUSE_WHY ]] && echo "; fusions OFF: $NO_FUSE_WHY"; }

# --- bench: the paper-2 block, the recipe's precision and megatron's BF16 mode ------------------------
bench() {
    local v=$1 b; b=$(budget_of "bench:$v")
    # the bench stops starting steps itself a few seconds before the stage's timeout
    run_stage "bench:$v" "$OUT/bench-$v.log" "$PY" "$HELPERS/bench.py" --variant "$v" --data-dir "$WORK/bench-data" \
        --num-layers "$LAYERS" --budget-s $((b - 8)) --out "$OUT/bench-$v.json" "${FUSE[@]}" "${STANDIN[@]}"
    finish "bench:$v" "$OUT/bench-$v.log" "$(summary_of "$OUT/bench-$v.log")$(fusion_note)"
}
for v in binary gf2 learned binary_bf16; do bench "$v"; done

# --- ckpt: save + load of the distributed checkpoint, bit-identical losses after it -------------------
run_stage ckpt "$OUT/ckpt.log" "$PY" "$HELPERS/ckpt_roundtrip.py" --data-dir "$WORK/bench-data" --work "$WORK/ckpt" \
    --out "$OUT/ckpt.json" "${FUSE[@]}" "${STANDIN[@]}"
finish ckpt "$OUT/ckpt.log" "$(summary_of "$OUT/ckpt.log")$(fusion_note)"
# --- ckpt:2ranks: the same on 2 ranks (NCCL collectives, fully parallel save/load), where 2 GPUs are ---
if ((CPU_STANDIN)) || (($(env_field "int(e.get('gpu_count', 0))") >= 2)); then
    run_stage ckpt:2ranks "$OUT/ckpt-2ranks.log" "$PY" "$HELPERS/ckpt_roundtrip.py" --nproc 2 --data-dir "$WORK/bench-data" \
        --work "$WORK/ckpt" --out "$OUT/ckpt-2ranks.json" "${FUSE[@]}" "${STANDIN[@]}"
    finish ckpt:2ranks "$OUT/ckpt-2ranks.log" "$(summary_of "$OUT/ckpt-2ranks.log")$(fusion_note)"
else
    stage ckpt:2ranks not_run 0 "$("$PY" -c "import sys; sys.path.insert(0, '$HELPERS'); import plan; print(plan.ONE_GPU_NO_NCCL_PAIR)")"
fi

# --- tests: the GPU-marked tests ----------------------------------------------------------------------
files=$(gpu_test_files)
run_stage tests "$OUT/pytest-gpu.log" "$PY" -m pytest -m gpu -q -rs -p no:cacheprovider --continue-on-collection-errors \
    --junitxml "$OUT/pytest-gpu.xml" $files
finish tests "$OUT/pytest-gpu.log" "$(last_line "$OUT/pytest-gpu.log")$(fusion_note)"

# --- TE: only where it is already on the machine (it cannot travel), in the time left -----------------
te_why="Transformer Engine cannot travel (wheels far over the 64 MiB carry) and is not importable here"
if [[ $(env_field "int(bool(e.get('transformer_engine_importable')))") != 1 ]]; then
    stage bench:te not_run 0 "$te_why: $(env_field "e.get('transformer_engine_error', 'env.json missing')")"
    stage bench:te_autocast not_run 0 "$te_why: no TE layers under fp32-autocast-bf16"
    stage bench:te_fp8 not_run 0 "$te_why: no TE, no FP8"
else
    # the recipe's exact path first (TE under fp32-autocast-bf16: never run before), then --bf16, then FP8
    for v in te_autocast te; do
        if (($(left) >= $(budget_of "bench:$v") + $(budget_of report))); then bench "$v"
        else stage "bench:$v" not_run 0 "TE is here, but only $(left)s of --budget-s $BUDGET are left"; fi
    done
    if [[ $(env_field "e.get('fp8_support', {}).get('delayed')") == yes ]] && (($(left) >= $(budget_of bench:te_fp8) + $(budget_of report))); then
        bench te_fp8
    else stage bench:te_fp8 not_run 0 "FP8 not supported here or no time left (env.json fp8_support: $(env_field "e.get('fp8_support')"))"; fi
fi
rm -rf "$WORK/bench-data" "$WORK/ckpt"

# --- report -------------------------------------------------------------------------------------------
stage report ok 0 "total $((SECONDS - START)) s of --budget-s $BUDGET"
timeout "$(budget_of report)" "$PY" "$HELPERS/report.py" write "$OUT"
log "done in $((SECONDS - START)) s: $OUT/gpu_check.md"
exit $failed
