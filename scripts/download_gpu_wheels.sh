#!/usr/bin/env bash
# Download, in one call on a machine with network, every wheel scripts/gpu_check.sh installs on an
# offline GPU machine (Python 3.12, x86_64 Linux, CUDA torch already there: torch, triton and
# nvidia-* are never downloaded), then check the folder against the committed manifest.
#
#   bash scripts/download_gpu_wheels.sh                 # -> wheels/ (megatron-core 0.19.2 + deps, pytest, ...)
#   bash scripts/download_gpu_wheels.sh --dest DIR --python-version 3.12 --platform manylinux_2_28_x86_64
#   bash scripts/download_gpu_wheels.sh --check         # no download: compare DIR with the manifest, sizes, 64 MiB
#   bash scripts/download_gpu_wheels.sh --build-te      # also Transformer Engine, into DIR-te (see below)
#
# What it does:
#   pip download --only-binary=:all: --python-version 3.12 --implementation cp --platform P --no-deps \
#       megatron-core==MCORE_VERSION numpy packaging pyyaml psutil pytest
#   then the requirements of those wheels (scripts/gpu_check/wheel_deps.py; torch, triton and nvidia-*
#   excluded, extras not followed) the same way, until nothing is missing. Then it writes
#   scripts/gpu_check/wheels.txt (name==version, file, bytes: commit it when it changed) and fails
#   if the folder is over 64 MiB (what travels with the checkout to the GPU machine).
# gpu_check.sh installs only the wheels the machine's torch python lacks (scripts/gpu_check/plan.py
# missing; on the lent H200 image: megatron-core alone); the rest travels for a barer machine.
# MCORE_VERSION (default 0.19.2, the newest 0.19.x on PyPI when this was written) is the megatron-core
# for Python 3.12; the CPU test suite in .venv (Python 3.11) runs 0.16.1, the 3.12 leg of scripts/test.sh (a cached venv)
# environments run 0.19.x. No editable install of this package is needed on the GPU machine
# (gpu_check.sh puts the checkout on PYTHONPATH), so no setuptools/wheel either.
#
# Transformer Engine: megatron-core 0.19.x declares `transformer-engine[pytorch,core_cu13]` with no
# version bound; its CI runs TE 2.17.1 (2.16.0 in its LTS image). TE_VERSION defaults to 2.17.1.
# TE CANNOT TRAVEL to the GPU check's machine: so TE, FP8 and CP are not measured there (below).
# PyPI has wheels of transformer_engine and transformer_engine_cu12/cu13 (each far over 64 MiB) but
# only the *source* of transformer_engine_torch, which is compiled against the local torch (CUDA
# toolkit and a matching torch needed; ~10-20 minutes). --build-te downloads the two wheels into
# DEST-te (a separate folder: it cannot travel in the 64 MiB) and runs
#   pip wheel --no-build-isolation --no-deps transformer_engine_torch==TE_VERSION
# there, which only helps if THIS machine has the GPU machine's torch and CUDA. Otherwise use an NGC
# PyTorch container, which ships TE. Without TE, gpu_check.sh runs the local-layer checks and
# reports the TE ones as not run.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=$ROOT/wheels PYVER=3.12 PLATFORM=manylinux_2_28_x86_64 BUILD_TE=0 CHECK_ONLY=0
MCORE_VERSION=${MCORE_VERSION:-0.19.2}
TE_VERSION=${TE_VERSION:-2.17.1}   # in the range megatron-core 0.19.x is tested with (docs/SCALING.md)
TE_CUDA=${TE_CUDA:-13}             # transformer_engine_cu13 (megatron-core's te extra: core_cu13) or 12
MANIFEST=$ROOT/scripts/gpu_check/wheels.txt
while (($#)); do
    case $1 in
        --dest) DEST=$2; shift 2 ;;
        --python-version) PYVER=$2; shift 2 ;;
        --platform) PLATFORM=$2; shift 2 ;;
        --build-te) BUILD_TE=1; shift ;;
        --check) CHECK_ONLY=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
PY=${PYTHON:-python3}
PLAN=$ROOT/scripts/gpu_check/plan.py
if ((CHECK_ONLY)); then
    exec "$PY" "$PLAN" wheels --wheels "$DEST" --manifest "$MANIFEST" --strict
fi
mkdir -p "$DEST"
get() {
    # manylinux wheels of any glibc level up to PLATFORM's, and pure-python ones
    "$PY" -m pip download -q --only-binary=:all: --python-version "$PYVER" --implementation cp \
        --platform "$PLATFORM" --platform manylinux2014_x86_64 --platform linux_x86_64 --platform any \
        --no-deps -d "$DEST" "$@"
}
# Older megatron-core wheels from an earlier run would satisfy nothing and still travel: drop them.
find "$DEST" -maxdepth 1 -name 'megatron_core-*.whl' ! -name "megatron_core-$MCORE_VERSION-*" -delete
get "megatron-core==$MCORE_VERSION" numpy packaging pyyaml psutil pytest tokenizers sentencepiece
for _ in 1 2 3 4 5; do
    mapfile -t need < <("$PY" "$ROOT/scripts/gpu_check/wheel_deps.py" "$DEST" --python-version "$PYVER" | grep .)
    ((${#need[@]})) || break
    echo "requirements still missing: ${need[*]}" >&2
    get "${need[@]}"
done
if ((BUILD_TE)); then
    mkdir -p "$DEST-te"
    get -d "$DEST-te" "transformer_engine==$TE_VERSION" "transformer_engine_cu$TE_CUDA==$TE_VERSION"
    "$PY" -m pip wheel --no-build-isolation --no-deps -w "$DEST-te" "transformer_engine_torch==$TE_VERSION"
fi
# The manifest: what gpu_check.sh --dry-run lists when the folder is absent (CI), and the size check.
"$PY" "$PLAN" write-manifest --wheels "$DEST" --manifest "$MANIFEST"
"$PY" "$PLAN" wheels --wheels "$DEST" --manifest "$MANIFEST" --strict
echo "copy $DEST next to the checkout on the GPU machine (carry: wheels) and run: bash scripts/gpu_check.sh" >&2
