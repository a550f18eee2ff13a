#!/usr/bin/env bash
# Download, on a machine with network, the wheels scripts/gpu_check.sh installs on an offline GPU
# machine (Python 3.12, x86_64 Linux, torch with CUDA already there; no torch is downloaded).
#
#   bash scripts/download_gpu_wheels.sh                        # -> wheels/ (megatron-core + deps, pytest, ...)
#   bash scripts/download_gpu_wheels.sh --dest DIR --python-version 3.12 --platform manylinux_2_28_x86_64
#   bash scripts/download_gpu_wheels.sh --build-te             # also Transformer Engine (see below)
#
# What it does:
#   pip download --only-binary=:all: --python-version 3.12 --implementation cp --platform P --no-deps \
#       megatron-core==0.16.1 numpy packaging pyyaml psutil pytest setuptools wheel
#   then the requirements of those wheels (scripts/gpu_check/wheel_deps.py; torch, triton and nvidia-*
#   excluded) the same way, until nothing is missing.
# megatron-core 0.16.1 is the version the CPU test suite runs against (and the newest on PyPI when
# this was written); set MCORE_VERSION to change it.
#
# Transformer Engine: PyPI has wheels of transformer_engine and transformer_engine_cu12 but only the
# *source* of transformer_engine_torch, which is compiled against the local torch (CUDA toolkit and a
# matching torch needed; ~10-20 minutes). --build-te downloads the two wheels and runs
#   pip wheel --no-build-isolation --no-deps transformer_engine_torch==TE_VERSION
# here, which only helps if THIS machine has the GPU machine's torch and CUDA (e.g. the same
# container image with network). Otherwise build that wheel on such a machine and drop it into the
# wheels folder, or use an NGC PyTorch container, which ships TE. Without TE, gpu_check.sh runs the
# local-layer checks and reports the TE ones as not run.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=$ROOT/wheels PYVER=3.12 PLATFORM=manylinux_2_28_x86_64 BUILD_TE=0
MCORE_VERSION=${MCORE_VERSION:-0.16.1}
TE_VERSION=${TE_VERSION:-2.11.0}   # megatron-core 0.16.1 pins transformer-engine >=2.9,<2.12 for its tests
while (($#)); do
    case $1 in
        --dest) DEST=$2; shift 2 ;;
        --python-version) PYVER=$2; shift 2 ;;
        --platform) PLATFORM=$2; shift 2 ;;
        --build-te) BUILD_TE=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
mkdir -p "$DEST"
PY=${PYTHON:-python3}
get() {
    # manylinux wheels of any glibc level up to PLATFORM's, and pure-python ones
    "$PY" -m pip download --only-binary=:all: --python-version "$PYVER" --implementation cp \
        --platform "$PLATFORM" --platform manylinux2014_x86_64 --platform linux_x86_64 --platform any \
        --no-deps -d "$DEST" "$@"
}
get "megatron-core==$MCORE_VERSION" numpy packaging pyyaml psutil pytest setuptools wheel
if ((BUILD_TE)); then
    get "transformer_engine==$TE_VERSION" "transformer_engine_cu12==$TE_VERSION"
    "$PY" -m pip wheel --no-build-isolation --no-deps -w "$DEST" "transformer_engine_torch==$TE_VERSION"
fi
for _ in 1 2 3 4 5; do
    mapfile -t need < <("$PY" "$ROOT/scripts/gpu_check/wheel_deps.py" "$DEST" --python-version "$PYVER")
    ((${#need[@]})) || break
    echo "requirements still missing: ${need[*]}" >&2
    get "${need[@]}"
done
echo "wheels in $DEST:" >&2
ls -1 "$DEST" >&2
echo "copy $DEST next to the checkout on the GPU machine and run: bash scripts/gpu_check.sh --wheels $DEST" >&2
