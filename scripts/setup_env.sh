#!/usr/bin/env bash
# Create (if missing) and update the test environments; torch goes in first and pinned, then this
# package, so that no install step picks a torch build of its own.
#
#   bash scripts/setup_env.sh          # .venv in the checkout: python3 ($PYTHON; Python 3.11 here), CPU
#                                      # torch==2.13.0, megatron-core from pyproject (0.16.1 on 3.11)
#   bash scripts/setup_env.sh --py312  # Python 3.12, torch==2.13.0 (on Linux PyPI has only the CUDA build
#                                      # for 3.12; it runs on CPU), the newest megatron-core 0.19.x, in
#                                      # ${MFC_VENV_CACHE:-$HOME/.cache/megatron-fixedcode}/venv-py3.12 (outside
#                                      # the checkout and reused, so the ~4.7 GB torch downloads once);
#                                      # prints that venv's path (the only line on stdout)
#
# Python 3.12 is $PYTHON312, else a working `python3.12` on PATH, else the newest
# $(pyenv root)/versions/3.12*/bin/python3.12 (pyenv's shim fails unless 3.12 is selected).
# One line per stage with its duration (on stderr). A torch already in .venv is kept (GPU machines: install
# your CUDA torch first).
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
MCORE_PY312=${MCORE_PY312:-0.19.*}   # the newest 0.19.x: pip picks the highest matching release

stage() {  # stage LABEL COMMAND... : one line "setup_env: LABEL ... N s"; the command's output only if it fails
    local label=$1 t0=$SECONDS log rc
    shift
    printf "setup_env: %s ... " "$label" >&2
    log=$(mktemp)
    if "$@" >"$log" 2>&1; then
        echo "$((SECONDS - t0)) s" >&2
        rm -f "$log"
    else
        rc=$?
        echo "FAILED (exit $rc after $((SECONDS - t0)) s):" >&2
        cat "$log" >&2
        rm -f "$log"
        return "$rc"
    fi
}

has_torch() {  # has_torch PYTHON [VERSION]: torch imports (and is VERSION, any local build tag)
    "$1" - "${2:-}" <<'PYEOF' >/dev/null 2>&1
import sys
import torch
sys.exit(bool(sys.argv[1]) and torch.__version__.split("+")[0] != sys.argv[1])
PYEOF
}

find_python312() {
    if [ -n "${PYTHON312:-}" ]; then
        echo "$PYTHON312"
        return
    fi
    if command -v python3.12 >/dev/null 2>&1 && python3.12 -c "" >/dev/null 2>&1; then
        command -v python3.12
        return
    fi
    local root
    root=$( (command -v pyenv >/dev/null 2>&1 && pyenv root) || echo "${PYENV_ROOT:-$HOME/.pyenv}")
    # shellcheck disable=SC2012  # version directories: sort -V picks 3.12.10 over 3.12.9
    { ls -d "$root"/versions/3.12*/bin/python3.12 2>/dev/null || true; } | sort -V | tail -n 1
}

setup_py311() {
    local py=${PYTHON:-python3}
    [ -x .venv/bin/python ] || stage "create .venv with $py" "$py" -m venv .venv
    local vpy=.venv/bin/python
    stage "upgrade pip" sh -c "'$vpy' -m pip install -q --upgrade pip >/dev/null 2>&1 || true"
    if has_torch "$vpy"; then
        echo "setup_env: torch already in .venv (kept)" >&2
    else
        stage "install torch==$TORCH_VERSION" "$vpy" -m pip install -q "torch==$TORCH_VERSION"
    fi
    stage "install this package [dev]" "$vpy" -m pip install -q -e ".[dev]"
    install_ft "$vpy"
}

# The [ft] extra without its deprecated pynvml shim, whose import-time FutureWarning torch.cuda would print in
# every process (nvidia-ml-py, also a dependency, provides the pynvml module itself). Both legs: megatron-core
# 0.19 meets 0.4.1 through compat/nvrx_release.py, and the 3.12 leg tests that it does.
NVRX_VERSION=0.4.1
install_ft() {
    stage "install nvidia-resiliency-ext==$NVRX_VERSION (--no-deps)" "$1" -m pip install -q --no-deps "nvidia-resiliency-ext==$NVRX_VERSION"
    stage "install its dependencies" "$1" -m pip install -q defusedxml nvidia-ml-py psutil
}

setup_py312() {
    local py
    py=$(find_python312)
    if [ -z "$py" ] || ! "$py" -c "import sys; assert sys.version_info[:2] == (3, 12)" >/dev/null 2>&1; then
        echo "setup_env: error: no Python 3.12 found (not \$PYTHON312, no working python3.12 on PATH, nothing under \$(pyenv root)/versions/3.12*/bin/python3.12); install it or set PYTHON312=/path/to/python3.12" >&2
        exit 1
    fi
    local venv=${MFC_VENV_CACHE:-$HOME/.cache/megatron-fixedcode}/venv-py3.12
    if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "" >/dev/null 2>&1; then
        rm -rf "$venv"
        mkdir -p "$(dirname "$venv")"
        stage "create $venv with $py" "$py" -m venv "$venv"
        stage "upgrade pip" "$venv/bin/python" -m pip install -q --upgrade pip
    fi
    local vpy=$venv/bin/python
    if has_torch "$vpy" "$TORCH_VERSION"; then
        echo "setup_env: torch==$TORCH_VERSION already in $venv (kept)" >&2
    else
        stage "install torch==$TORCH_VERSION" "$vpy" -m pip install -q "torch==$TORCH_VERSION"
    fi
    # reinstall only when pyproject.toml, the pins or the checkout's location changed since the last run
    local stamp="$venv/.mfc-installed" want
    want="$(sha256sum pyproject.toml | cut -c1-64) $MCORE_PY312 $TORCH_VERSION nvrx$NVRX_VERSION $PWD"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        echo "setup_env: this package [dev] already installed from $PWD (pyproject.toml unchanged)" >&2
    else
        stage "install this package [dev] with megatron-core==$MCORE_PY312" \
            "$vpy" -m pip install -q -e ".[dev]" "megatron-core==$MCORE_PY312" "torch==$TORCH_VERSION"
        install_ft "$vpy"
        echo "$want" > "$stamp"
    fi
    # a reused venv keeps its megatron-core unless asked: pick up a newer release of the series
    stage "megatron-core: newest $MCORE_PY312" "$vpy" -m pip install -q -U "megatron-core==$MCORE_PY312" "torch==$TORCH_VERSION"
    "$vpy" - <<'PYEOF' >&2
import importlib.metadata as md, sys
print(f"setup_env: py3.12 env: Python {sys.version.split()[0]}, torch {md.version('torch')}, "
      f"megatron-core {md.version('megatron-core')}, nvidia-resiliency-ext {md.version('nvidia-resiliency-ext')}")
PYEOF
    echo "$venv"
}

case "${1:-}" in
    "") setup_py311 ;;
    --py312) setup_py312 ;;
    *) echo "usage: bash scripts/setup_env.sh [--py312]" >&2; exit 2 ;;
esac
