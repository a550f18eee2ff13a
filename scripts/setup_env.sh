#!/usr/bin/env bash
# Create .venv (if missing) with the CPU build of torch and this package installed.
# torch is installed first and pinned so that no install step can pull a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
python - <<'PYEOF' || python -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
import torch  # noqa: F401  (already installed: keep whatever build is there)
PYEOF
python -m pip install -q -e ".[dev]"
