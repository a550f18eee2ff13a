#!/usr/bin/env bash
# Every GPU check in one run, in under 8 minutes on one H100/H200, for whoever is lent a GPU:
#
#   bash scripts/gpu_check.sh [--out DIR] [--wheels DIR] [--venv DIR] [--budget-s S] [--dry-run] [--install-only] [--help]
#
#   --out DIR        results: gpu_check.json + gpu_check.md (+ env.json, stages.jsonl, pytest-gpu.xml/.log,
#                    bench-<variant>.json/.log); default ./gpu_check_out
#   --wheels DIR     wheels to install from, offline (scripts/download_gpu_wheels.sh makes them on a
#                    machine with network; they travel with the checkout, <= 64 MiB); default ./wheels
#   --venv DIR       the virtualenv to create (--system-site-packages, so the machine's CUDA torch and,
#                    if present, its Transformer Engine are used) or reuse; default ${TMPDIR:-/tmp}/mfc-gpu-venv
#   --budget-s S     wall-clock limit of the whole check (default 480): a stage that would not fit in
#                    what is left is recorded as not_run instead of started
#   --dry-run        on any machine (CPU): print the plan (stages and their time budgets), the wheels it
#                    would install (name, version, size) and their total, and fail if the wheels are over
#                    64 MiB or the budgets over 480 s; then check the wiring (the files it would run, the
#                    helpers on toy inputs, the report writers on fake numbers)
#   --install-only   only the install stage (needs no GPU): how the offline install is tested on CPU
#
# Expects: one NVIDIA GPU, Python 3.12 with a CUDA build of torch, no network, no megatron-core.
# Stages (scripts/gpu_check/plan.py holds the budgets; each stage runs under `timeout <budget>`):
#   env           python/torch/CUDA/GPU, megatron-core, TE and its FP8 support here  -> env.json
#   install       venv; exactly the wheels of scripts/gpu_check/wheels.txt (megatron-core 0.19.x, numpy,
#                 packaging, pyyaml, psutil, pytest + deps) with pip --no-index from --wheels, unless
#                 megatron-core is importable already; this checkout on PYTHONPATH; random-token data
#   tests         pytest -m gpu on the files with GPU-marked tests: CUDA codes vs numpy, TE forward/backward,
#                 TE-vs-local logits parity in BF16, TE spec choice, FP8 training steps, overlap flags
#                 (the TE ones are skipped by pytest, with the reason, where TE is not importable)
#   bench:*       the paper-2 block (h 2048, FFN 8192 SwiGLU, 32 heads, seq 2048, micro batch 8) at 4 of its
#                 24 layers, BF16, with the real trainer: binary, gf2 and learned with local layers, then
#                 binary with Transformer Engine layers (and TE + FP8) only where TE imports ("not_run"
#                 otherwise): tokens/s, model TFLOP/s, MFU, peak memory, and the device of every parameter,
#                 buffer and batch tensor (all must be on CUDA: a CPU tensor fails the stage)
#   report        gpu_check.json + gpu_check.md; printed at the end
# Every stage is recorded as ok / failed / skipped / not_run with the reason; nothing is skipped silently.
# Exit status: 0 when no stage failed.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$PWD/gpu_check_out WHEELS=$PWD/wheels VENV=${TMPDIR:-/tmp}/mfc-gpu-venv BUDGET=480 DRY=0 INSTALL_ONLY=0
while (($#)); do
    case $1 in
        --out) OUT=$2; shift 2 ;;
        --wheels) WHEELS=$2; shift 2 ;;
        --venv) VENV=$2; shift 2 ;;
        --budget-s) BUDGET=$2; shift 2 ;;
        --dry-run) DRY=1; shift ;;
        --install-only) INSTALL_ONLY=1; shift ;;
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
[[ -d $WHEELS ]] && WHEELS=$(cd "$WHEELS" && pwd)
HELPERS=$ROOT/scripts/gpu_check
PY=${PYTHON:-python3}
START=$SECONDS
log() { echo "[gpu_check +$((SECONDS - START))s] $*" >&2; }
stage() { "$PY" "$HELPERS/report.py" stage "$OUT" "$@"; }
budget_of() { "$PY" "$HELPERS/plan.py" budget "$1"; }
gpu_test_files() { (cd "$ROOT" && grep -l "pytest.mark.gpu" tests/test_*.py); }
left() { echo $((BUDGET - (SECONDS - START))); }
export PYTHONWARNINGS=ignore OMP_NUM_THREADS=8

if ((DRY)); then
    # --- the plan and the wiring, on any machine ---------------------------------------------------
    cd "$ROOT" || exit 2
    rm -f "$OUT"/stages.jsonl
    fail=0
    check() { local what=$1; shift; if "$@" >"$OUT/dry-run.log" 2>&1; then log "ok: $what"; else log "FAILED: $what"; cat "$OUT/dry-run.log" >&2; fail=1; fi; }
    [[ -n ${VIRTUAL_ENV:-} || ! -f $ROOT/.venv/bin/activate ]] || source "$ROOT/.venv/bin/activate"
    PY=python
    log "would: create $VENV (--system-site-packages), install offline from $WHEELS, write to $OUT"
    # The plan, the wheels and both limits: printed to stdout; over a limit fails the dry run.
    if "$PY" "$HELPERS/plan.py" show --wheels "$WHEELS"; then log "ok: wheels <= 64 MiB and stage budgets <= 480 s"
    else log "FAILED: the plan is over a limit (above)"; fail=1; fi
    files=$(gpu_test_files | tr '\n' ' ')
    log "GPU test files: $files"
    for f in $files; do check "$f exists" test -f "$ROOT/$f"; done
    for f in tests/test_te_parity.py tests/test_te_flags.py tests/test_gpu_te.py; do
        check "$f is among them" grep -qw "$f" <<<"$files"
    done
    check "pytest collects the GPU tests" "$PY" -m pytest -q -p no:cacheprovider --collect-only -m gpu $files
    for h in env_report bench report wheel_deps plan; do
        check "scripts/gpu_check/$h.py imports" "$PY" -c "import sys; sys.path.insert(0, '$HELPERS'); import $h"
    done
    check "env_report.py writes env.json" "$PY" "$HELPERS/env_report.py" --out "$OUT/env.json"
    check "bench.py: the trainer accepts the flags of every variant" "$PY" "$HELPERS/bench.py" --check
    check "bench.py: the same path at toy size on CPU (data, trainer, 2 steps, placement, summary)" "$PY" \
        "$HELPERS/bench.py" --variant learned --cpu-smoke --warmup 1 --steps 1 --data-dir "$OUT/smoke-data" \
        --out "$OUT/smoke-bench.json"
    check "wheel_deps.py runs" "$PY" "$HELPERS/wheel_deps.py" "$OUT"
    check "report writers on fake numbers" "$PY" "$HELPERS/report.py" fake "$OUT/fake"
    check "download_gpu_wheels.sh --help" bash "$ROOT/scripts/download_gpu_wheels.sh" --help
    ((fail)) && { log "dry run: problems above"; exit 1; }
    log "dry run ok: fake report in $OUT/fake/gpu_check.md"
    exit 0
fi

cd "$ROOT" || exit 2
rm -f "$OUT"/stages.jsonl "$OUT"/bench-*.json "$OUT"/pytest-gpu.xml
failed=0

# run_stage NAME COMMAND...: under `timeout <budget>` (or not_run when it would not fit); sets rc
run_stage() {
    local name=$1; shift
    local b; b=$(budget_of "$name")
    if (($(left) < b)); then rc=125; stage "$name" not_run 0 "time budget: ${b}s needed, $(left)s of --budget-s $BUDGET left"; return; fi
    timeout --kill-after 5 "$b" "$@"
    rc=$?
}

# --- env ----------------------------------------------------------------------------------------
t=$SECONDS
if ((INSTALL_ONLY)); then
    log "--install-only: no GPU needed"
elif ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    "$PY" "$HELPERS/env_report.py" --out "$OUT/env.json" >/dev/null 2>&1
    stage env failed $((SECONDS - t)) "no CUDA GPU visible to $($PY -c 'import torch; print("torch", torch.__version__)' 2>&1 | tail -1)"
    for s in install tests bench; do stage "$s" not_run 0 "needs a CUDA GPU"; done
    "$PY" "$HELPERS/report.py" write "$OUT"
    exit 1
else
    pyver=$("$PY" -c 'import platform; print(platform.python_version())')
    stage env ok $((SECONDS - t)) "python $pyver$([[ $pyver == 3.12* ]] || echo ' (expected 3.12: wheels may not match)'); $(nvidia-smi -L 2>/dev/null | head -1)"
fi

# --- install ------------------------------------------------------------------------------------
t=$SECONDS
notes=()
install_fail() {
    stage install failed $((SECONDS - t)) "$1"
    for s in tests bench; do stage "$s" not_run 0 "install failed"; done
    "$PY" "$HELPERS/env_report.py" --out "$OUT/env.json" >/dev/null 2>&1; "$PY" "$HELPERS/report.py" write "$OUT"; exit 1
}
if [[ ! -x $VENV/bin/python ]]; then "$PY" -m venv --system-site-packages "$VENV" || install_fail "python -m venv failed"; fi
source "$VENV/bin/activate"
PY=python
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}   # this checkout: no build, no setuptools needed
if python -c "import megatron.core" 2>/dev/null; then
    notes+=("megatron-core $(python -c 'import importlib.metadata as m; print(m.version("megatron-core"))') already importable")
else
    [[ -d $WHEELS ]] || install_fail "megatron-core is not importable and $WHEELS does not exist (run scripts/download_gpu_wheels.sh where there is network; carry wheels/)"
    python "$HELPERS/plan.py" requirements >"$OUT/requirements.txt"
    # Only the manifest's pins, only from the folder; what the machine has (torch, numpy, ...) is kept.
    # --no-compile: byte-compiling every installed module (numpy, pygments, ...) costs more than it saves
    if timeout $(($(budget_of install) - (SECONDS - t) - 5)) python -m pip install -q --no-index --find-links "$WHEELS" \
            --no-compile --disable-pip-version-check -r "$OUT/requirements.txt" >"$OUT/install.log" 2>&1; then
        notes+=("installed offline from $WHEELS: $(python -c 'import importlib.metadata as m; print("megatron-core", m.version("megatron-core"))')")
    else
        install_fail "pip install --no-index --find-links $WHEELS failed (install.log): $(tail -1 "$OUT/install.log")"
    fi
fi
if python -c "import transformer_engine.pytorch" 2>/dev/null; then
    notes+=("Transformer Engine $(python -c 'import importlib.metadata as m; print(m.version("transformer_engine"))' 2>/dev/null) importable")
else
    notes+=("NO Transformer Engine (not importable; PyPI has no wheel of transformer_engine_torch and TE's CUDA wheels exceed the 64 MiB carry): TE tests, TE and FP8 benchmarks not run")
fi
# the import check (megatron.core, yaml, psutil, pytest) and the bench data in one process
if ! timeout $(($(budget_of install) - (SECONDS - t) - 10)) python "$HELPERS/bench.py" --make-data \
        --data-dir "$OUT/bench-data" >>"$OUT/install.log" 2>&1; then
    install_fail "bench.py --make-data (imports megatron.core, yaml, psutil, pytest; writes the data) failed (install.log): $(tail -1 "$OUT/install.log")"
fi
timeout 10 python "$HELPERS/env_report.py" --out "$OUT/env.json" >/dev/null
stage install ok $((SECONDS - t)) "$(IFS=';'; echo "${notes[*]}")"
log "install: ${notes[*]}"
((INSTALL_ONLY)) && { python "$HELPERS/report.py" write "$OUT" >/dev/null; log "--install-only: done"; exit 0; }
has_te=$(python -c "import json; e=json.load(open('$OUT/env.json')); print(int(bool(e.get('transformer_engine_importable'))))")
has_fp8=$(python -c "import json; e=json.load(open('$OUT/env.json')); print(int(e.get('fp8_support', {}).get('delayed') == 'yes'))")

# --- tests --------------------------------------------------------------------------------------
t=$SECONDS
files=$(gpu_test_files)
log "pytest -m gpu $(echo $files)"
run_stage tests python -m pytest -m gpu -q -rs -p no:cacheprovider --continue-on-collection-errors \
    --junitxml "$OUT/pytest-gpu.xml" $files >"$OUT/pytest-gpu.log" 2>&1
summary=$(tail -1 "$OUT/pytest-gpu.log" 2>/dev/null)
case $rc in
    125) ;;
    0) stage tests ok $((SECONDS - t)) "$summary" ;;
    124|137) stage tests failed $((SECONDS - t)) "timed out after $(budget_of tests)s (pytest-gpu.log): $summary"; failed=1 ;;
    *) stage tests failed $((SECONDS - t)) "exit $rc: $summary (pytest-gpu.log)"; failed=1 ;;
esac

# --- bench --------------------------------------------------------------------------------------
variants=(binary gf2 learned)
if ((has_te)); then variants+=(te); else stage bench:te not_run 0 "Transformer Engine not importable here (env.json transformer_engine_error)"; fi
if ((has_fp8)); then variants+=(te_fp8)
else stage bench:te_fp8 not_run 0 "FP8 not available here (TE missing or unsupported on this GPU: env.json fp8_support)"; fi
for v in "${variants[@]}"; do
    t=$SECONDS
    b=$(budget_of "bench:$v")
    log "bench $v (budget ${b}s)"
    # the bench stops starting steps itself a few seconds before the stage's timeout
    run_stage "bench:$v" python "$HELPERS/bench.py" --variant "$v" --data-dir "$OUT/bench-data" \
        --budget-s $((b - 8)) --out "$OUT/bench-$v.json" >"$OUT/bench-$v.log" 2>&1
    case $rc in
        125) ;;
        0) stage "bench:$v" ok $((SECONDS - t)) "$(tail -1 "$OUT/bench-$v.log" | cut -c1-300)" ;;
        *) stage "bench:$v" failed $((SECONDS - t)) "exit $rc$( ((rc == 124 || rc == 137)) && echo " (timeout ${b}s)") (bench-$v.log): $(grep -v '^\s*$' "$OUT/bench-$v.log" | tail -1 | cut -c1-300)"
           failed=1 ;;
    esac
done
rm -rf "$OUT/bench-data"

# --- report -------------------------------------------------------------------------------------
t=$SECONDS
stage report ok 0 "total $((SECONDS - START)) s of --budget-s $BUDGET"
timeout "$(budget_of report)" python "$HELPERS/report.py" write "$OUT"
log "done in $((SECONDS - START)) s: $OUT/gpu_check.md"
exit $failed
