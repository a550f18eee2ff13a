#!/usr/bin/env bash
# Set up .venv and run the whole CPU test suite (GPU tests skip themselves).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
. .venv/bin/activate
python -m pytest -q "$@"
