#!/usr/bin/env bash
# Every GPU check in one run (< 8 minutes on one H100/H200), for whoever is lent a GPU:
#
#   bash scripts/gpu_check.sh [--out DIR] [--wheels DIR] [--venv DIR] [--budget-s S] [--dry-run] [--help]
#
#   --out DIR      results: gpu_check.json + gpu_check.md (+ env.json, stages.jsonl, pytest-gpu.xml/.log,
#                  bench-<variant>.json/.log); default ./gpu_check_out
#   --wheels DIR   wheels to install from, offline (scripts/download_gpu_wheels.sh makes them on a
#                  machine with network); default ./wheels
#   --venv DIR     the virtualenv to create (--system-site-packages, so the machine's CUDA torch and,
#                  if present, its Transformer Engine are used); default ${TMPDIR:-/tmp}/mfc-gpu-venv
#   --budget-s S   stop starting new stages after S seconds (default 450; each stage has its own timeout)
#   --dry-run      on any machine (CPU): check the wiring — arguments, the files it would run, that the
#                  python helpers import and accept their inputs, the report writers on fake numbers
#
# Expects: one NVIDIA GPU, Python 3.12 with a CUDA build of torch, no network. Stages:
#   1 env       python/torch/CUDA/GPU, megatron-core, TE and its FP8 support here  -> env.json
#   2 install   venv; megatron-core (+ numpy/packaging/pyyaml/psutil/pytest) from --wheels unless importable;
#               this package (editable, else PYTHONPATH); Transformer Engine from --wheels when its three
#               wheels are there (transformer_engine, _cu12, _torch) and it is not importable already
#   3 tests     pytest -m gpu on the files with GPU-marked tests: CUDA codes vs numpy, TE forward/backward,
#               TE-vs-local logits parity in BF16 (learned/binary/gf2), TE spec choice, FP8 training
#               steps (delayed, tensorwise) where TE supports FP8 here, overlap flags
#   4 bench     the paper-2 1.7B recipe on this GPU (micro batch 8 x 2048, global batch 8, BF16, full
#               recompute): learned vs binary (and binary + FP8 when supported): tokens/s, model TFLOP/s,
#               MFU, peak memory
#   5 report    gpu_check.json + gpu_check.md; printed at the end
# Every stage is recorded as ok / failed / skipped / not_run with the reason; nothing is skipped silently.
# Exit status: 0 when no stage failed.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$PWD/gpu_check_out WHEELS=$PWD/wheels VENV=${TMPDIR:-/tmp}/mfc-gpu-venv BUDGET=450 DRY=0
while (($#)); do
    case $1 in
        --out) OUT=$2; shift 2 ;;
        --wheels) WHEELS=$2; shift 2 ;;
        --venv) VENV=$2; shift 2 ;;
        --budget-s) BUDGET=$2; shift 2 ;;
        --dry-run) DRY=1; shift ;;
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
HELPERS=$ROOT/scripts/gpu_check
PY=${PYTHON:-python3}
START=$SECONDS
log() { echo "[gpu_check +$((SECONDS - START))s] $*" >&2; }
stage() { "$PY" "$HELPERS/report.py" stage "$OUT" "$@"; }
gpu_test_files() { (cd "$ROOT" && grep -l "pytest.mark.gpu" tests/test_*.py); }
export PYTHONWARNINGS=ignore OMP_NUM_THREADS=8

if ((DRY)); then
    # --- the wiring, on any machine ---------------------------------------------------------------
    cd "$ROOT" || exit 2
    rm -f "$OUT"/stages.jsonl
    fail=0
    check() { local what=$1; shift; if "$@" >"$OUT/dry-run.log" 2>&1; then log "ok: $what"; else log "FAILED: $what"; cat "$OUT/dry-run.log" >&2; fail=1; fi; }
    [[ -n ${VIRTUAL_ENV:-} || ! -f $ROOT/.venv/bin/activate ]] || source "$ROOT/.venv/bin/activate"
    PY=python
    log "would: create $VENV (--system-site-packages), install from $WHEELS, write to $OUT"
    [[ -d $WHEELS ]] && log "wheels: $(ls "$WHEELS" | tr '\n' ' ')" || log "wheels: $WHEELS does not exist (needed on the GPU machine unless megatron-core is importable)"
    files=$(gpu_test_files | tr '\n' ' ')
    log "GPU test files: $files"
    for f in $files; do check "$f exists" test -f "$ROOT/$f"; done
    for f in tests/test_te_parity.py tests/test_te_flags.py tests/test_gpu_te.py; do
        check "$f is among them" grep -qw "$f" <<<"$files"
    done
    check "pytest collects the GPU tests" "$PY" -m pytest -q -p no:cacheprovider --collect-only -m gpu $files
    for h in env_report bench report wheel_deps; do
        check "scripts/gpu_check/$h.py imports" "$PY" -c "import sys; sys.path.insert(0, '$HELPERS'); import $h"
    done
    check "env_report.py writes env.json" "$PY" "$HELPERS/env_report.py" --out "$OUT/env.json"
    check "bench.py: the trainer accepts the flags of every variant" "$PY" "$HELPERS/bench.py" --check
    check "bench.py: the same path at toy size on CPU (data, trainer, 2 steps, summary)" "$PY" "$HELPERS/bench.py" \
        --variant learned --cpu-smoke --warmup 1 --steps 1 --data-dir "$OUT/smoke-data" --out "$OUT/smoke-bench.json"
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
left() { echo $((BUDGET - (SECONDS - START))); }

# --- 1 env --------------------------------------------------------------------------------------
t=$SECONDS
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    "$PY" "$HELPERS/env_report.py" --out "$OUT/env.json" >/dev/null 2>&1
    stage env failed $((SECONDS - t)) "no CUDA GPU visible to $($PY -c 'import torch; print("torch", torch.__version__)' 2>&1 | tail -1)"
    for s in install tests bench; do stage "$s" not_run 0 "needs a CUDA GPU"; done
    "$PY" "$HELPERS/report.py" write "$OUT"
    exit 1
fi
pyver=$("$PY" -c 'import platform; print(platform.python_version())')
stage env ok $((SECONDS - t)) "python $pyver$([[ $pyver == 3.12* ]] || echo ' (expected 3.12: wheels may not match)'); $(nvidia-smi -L 2>/dev/null | head -1)"

# --- 2 install ----------------------------------------------------------------------------------
t=$SECONDS
notes=()
if [[ ! -x $VENV/bin/python ]]; then "$PY" -m venv --system-site-packages "$VENV" || { stage install failed $((SECONDS - t)) "python -m venv failed"; exit 1; }; fi
source "$VENV/bin/activate"
PY=python
pipi() { python -m pip install -q --no-index --find-links "$WHEELS" "$@"; }
if python -c "import megatron.core" 2>/dev/null; then
    notes+=("megatron-core $(python -c 'import importlib.metadata as m; print(m.version("megatron-core"))') already importable")
elif pipi "megatron-core==${MCORE_VERSION:-0.16.1}"; then
    notes+=("megatron-core ${MCORE_VERSION:-0.16.1} from $WHEELS")
else
    stage install failed $((SECONDS - t)) "megatron-core not importable and not installable from $WHEELS (run scripts/download_gpu_wheels.sh where there is network)"
    for s in tests bench; do stage "$s" not_run 0 "megatron-core missing"; done
    "$PY" "$HELPERS/env_report.py" --out "$OUT/env.json" >/dev/null 2>&1; "$PY" "$HELPERS/report.py" write "$OUT"; exit 1
fi
for mod_pkg in yaml:pyyaml psutil:psutil pytest:pytest; do
    python -c "import ${mod_pkg%%:*}" 2>/dev/null || pipi "${mod_pkg#*:}" || notes+=("${mod_pkg#*:} missing")
done
if pipi --no-build-isolation --no-deps -e "$ROOT" >/dev/null 2>&1; then
    notes+=("megatron-fixedcode installed (editable)")
else
    export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
    notes+=("megatron-fixedcode via PYTHONPATH (editable install needs setuptools>=68 in $WHEELS)")
fi
if python -c "import transformer_engine.pytorch" 2>/dev/null; then
    notes+=("Transformer Engine already importable")
elif compgen -G "$WHEELS/transformer_engine_torch-*.whl" >/dev/null; then
    if pipi --no-build-isolation "transformer_engine[pytorch]" >"$OUT/te-install.log" 2>&1 && python -c "import transformer_engine.pytorch" 2>>"$OUT/te-install.log"; then
        notes+=("Transformer Engine installed from $WHEELS")
    else
        notes+=("Transformer Engine install FAILED (te-install.log): TE checks will skip")
    fi
else
    notes+=("NO Transformer Engine: not importable, and no prebuilt transformer_engine_torch wheel in $WHEELS (PyPI has only its source; see scripts/download_gpu_wheels.sh --build-te): TE parity, FP8 and TE benchmarks will be reported as skipped")
fi
python "$HELPERS/env_report.py" --out "$OUT/env.json" >/dev/null
stage install ok $((SECONDS - t)) "$(IFS=';'; echo "${notes[*]}")"
log "install: ${notes[*]}"
has_fp8=$(python -c "import json; e=json.load(open('$OUT/env.json')); print(int(e.get('fp8_support', {}).get('delayed') == 'yes'))")

# --- 3 tests ------------------------------------------------------------------------------------
t=$SECONDS
files=$(gpu_test_files)
log "pytest -m gpu $(echo $files)"
if (($(left) > 60)); then
    timeout $(( $(left) > 240 ? 240 : $(left) )) python -m pytest -m gpu -q -rs -p no:cacheprovider \
        --continue-on-collection-errors --junitxml "$OUT/pytest-gpu.xml" $files >"$OUT/pytest-gpu.log" 2>&1
    rc=$?
else
    rc=124; echo "not started: time budget" >"$OUT/pytest-gpu.log"
fi
summary=$(tail -1 "$OUT/pytest-gpu.log")
case $rc in
    0) stage tests ok $((SECONDS - t)) "$summary" ;;
    124) stage tests failed $((SECONDS - t)) "timed out (pytest-gpu.log): $summary"; failed=1 ;;
    *) stage tests failed $((SECONDS - t)) "exit $rc: $summary (pytest-gpu.log)"; failed=1 ;;
esac

# --- 4 bench ------------------------------------------------------------------------------------
variants=(learned binary)
if ((has_fp8)); then variants+=(binary_fp8); else stage bench:binary_fp8 skipped 0 "FP8 not available here (TE missing or unsupported on this GPU: env.json fp8_support)"; fi
for v in "${variants[@]}"; do
    if (($(left) < 60)); then stage "bench:$v" not_run 0 "time budget (--budget-s $BUDGET) spent"; continue; fi
    t=$SECONDS
    log "bench $v"
    timeout $(( $(left) > 150 ? 150 : $(left) )) python "$HELPERS/bench.py" --variant "$v" --data-dir "$OUT/bench-data" \
        --out "$OUT/bench-$v.json" >"$OUT/bench-$v.log" 2>&1
    rc=$?
    if ((rc == 0)); then
        stage "bench:$v" ok $((SECONDS - t)) "$(tail -1 "$OUT/bench-$v.log" | cut -c1-300)"
    else
        stage "bench:$v" failed $((SECONDS - t)) "exit $rc$( ((rc == 124)) && echo ' (timeout)') (bench-$v.log): $(grep -v '^\s*$' "$OUT/bench-$v.log" | tail -1 | cut -c1-300)"
        failed=1
    fi
done
rm -rf "$OUT/bench-data"

# --- 5 report -----------------------------------------------------------------------------------
python "$HELPERS/report.py" write "$OUT"
log "done in $((SECONDS - START)) s: $OUT/gpu_check.md"
exit $failed
