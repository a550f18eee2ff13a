#!/usr/bin/env bash
# The install stage of scripts/gpu_check.sh (run under its timeout; output to OUT/install.log):
#
#   bash scripts/gpu_check/install.sh PYTHON WHEELS SITE OUT DATA [--cpu-standin]
#
# PYTHON is the interpreter whose `import torch` works (gpu_check.sh found it: on the lent H200 the
# image's own venv, /opt/torch/.venv, not the base interpreter). No new venv: a
# `--system-site-packages` venv of the base interpreter would hide that torch. Instead, the wheels
# PYTHON lacks (scripts/gpu_check/plan.py missing: the manifest's roots and their requirements
# that it does not have at a satisfying version; its own numpy, packaging, typing-extensions, ...
# are kept; torch, triton and nvidia-* are never installed) go into SITE with
# `pip install --no-index --no-deps --target SITE` (unzipped by Python when PYTHON has no pip);
# gpu_check.sh puts SITE and this checkout on PYTHONPATH. Then the import check and the bench data
# (random tokens, into DATA).
# The last line printed is the stage's summary.
set -uo pipefail
PY=$1 WHEELS=$2 SITE=$3 OUT=$4 DATA=$5
shift 5
HELPERS=$(cd "$(dirname "$0")" && pwd)
notes=()
fail() { echo "FAILED: $*"; exit 1; }
mkdir -p "$SITE" || fail "cannot create $SITE"
if [[ -d $WHEELS ]] && compgen -G "$WHEELS/*.whl" >/dev/null; then
    "$PY" "$HELPERS/plan.py" missing --wheels "$WHEELS" >"$OUT/install-missing.txt" \
        || fail "plan.py missing: a package is needed and $WHEELS has no wheel of it (above)"
    mapfile -t need < <(grep . "$OUT/install-missing.txt")
    if ((${#need[@]})); then
        echo "installing into $SITE: ${need[*]##*/}"
        if "$PY" -m pip --version >/dev/null 2>&1; then
            # --no-compile: byte-compiling costs more than it saves for one run
            "$PY" -m pip install --no-index --no-deps --no-compile --disable-pip-version-check --upgrade \
                --target "$SITE" "${need[@]}" || fail "pip install --no-index --no-deps --target $SITE failed (above)"
        else
            echo "no pip in $PY: unzipping the wheels into $SITE"
            for w in "${need[@]}"; do "$PY" -m zipfile -e "$w" "$SITE" || fail "unzip $w failed"; done
        fi
        notes+=("installed ${#need[@]} wheel(s) the machine lacks into $SITE: $(printf '%s ' "${need[@]##*/}")")
    else
        notes+=("nothing installed: $PY has every package the check needs")
    fi
else
    notes+=("no wheels in $WHEELS: using what $PY has")
fi
# the import check (megatron.core, yaml, psutil, pytest) and the bench data in one process
"$PY" "$HELPERS/bench.py" --make-data --data-dir "$DATA" "$@" \
    || fail "bench.py --make-data (imports megatron.core, yaml, psutil, pytest; writes the data) failed (above)"
mcore=$("$PY" -c 'import importlib.metadata as m, megatron.core as c; print(m.version("megatron-core"), c.__file__)') \
    || fail "megatron.core is not importable (above)"
notes+=("megatron-core $mcore")
printf '%s; ' "${notes[@]:0:${#notes[@]}-1}"; echo "${notes[-1]}"
