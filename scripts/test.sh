#!/usr/bin/env bash
# The test command (CI runs exactly this, via .ci/run). Two legs, CPU + gloo, GPU tests skip:
#   1. Python 3.11, megatron-core 0.16.1 (.venv): the whole suite; arguments go to this pytest
#      (bash scripts/test.sh -k resume -x).
#   2. Python 3.12, the newest megatron-core 0.19.x (a reused venv outside the checkout, see
#      scripts/setup_env.sh --py312): the core subset below (test_quickstart_pipeline runs the
#      quickstart pipeline --quick end to end on that line).
#      MFC_SKIP_PY312=1 skips it, MFC_SKIP_PY311=1 skips leg 1 (quick local runs only: CI runs both).
# Leg 1 runs tests/launchers/test_slurm*.py against a real local Slurm cluster: MFC_SLURM=1 (the default here) makes
# its fixture start one (scripts/slurm_local.sh start: root, apt-get on a fresh machine) and fail when it
# cannot; outside CI, MFC_SLURM=0 leaves them skipped unless a cluster already runs.
# Both legs run even when the first fails; the script fails if either did. Each leg runs on two pytest-xdist
# workers, one test file per worker at a time (--dist loadfile: a module's fixtures are built once): most
# tests wait on subprocesses with OMP_NUM_THREADS=1, so one worker leaves a core idle; MFC_TEST_WORKERS=0
# runs serially (xdist's -n 0).
# `bash scripts/test.sh --fast` is the fast lane (README, Tests): leg 1 only, the tests not marked slow
# (no process launches, no training beyond a few in-process steps), no Slurm; every room of the package has some.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--fast" ]; then
    shift
    t=$SECONDS
    bash scripts/setup_env.sh
    rc=0
    (. .venv/bin/activate && MFC_SLURM=0 python -m pytest -q -n "${MFC_TEST_WORKERS:-2}" -m "not slow and not gpu" \
        --durations=10 "$@") || rc=$?
    echo "test.sh: fast lane (Python 3.11, megatron-core 0.16.1, not slow): exit $rc in $((SECONDS - t)) s"
    exit "$rc"
fi
CORE_SUBSET=(
    tests/models/test_fixed_code_embedding.py tests/models/test_parallel_parity.py tests/training/test_pretrain.py
    tests/export/test_export_parity.py tests/compat/test_compat_cpu.py tests/cli/test_quickstart_pipeline.py
    tests/compat/test_precision.py  # patches megatron-core internals (compat/autocast.py) that differ by version
    tests/training/test_distributed_optimizer.py  # megatron's distributed optimizer, BF16, resharding (compat/cpu.py,
                                                  # compat/torch_adam.py)
    tests/arguments/test_megatron_reference.py  # the dry run against Megatron-LM's parser (3 s): the same on both lines
)
WORKERS=(-n "${MFC_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder)  # files in collection order: tests/conftest.py puts the longest first
T0=$SECONDS
elapsed() { printf "%dm%02ds" $(($1 / 60)) $(($1 % 60)); }

rc311=0
if [ "${MFC_SKIP_PY311:-0}" = 1 ]; then
    echo "test.sh: leg 1 (Python 3.11, megatron-core 0.16.1) skipped: MFC_SKIP_PY311=1"
else
    t=$SECONDS
    bash scripts/setup_env.sh
    (. .venv/bin/activate && export MFC_SLURM=${MFC_SLURM:-1} && python -m pytest -q "${WORKERS[@]}" --durations=30 "$@") || rc311=$?
    echo "test.sh: leg 1 (Python 3.11, megatron-core 0.16.1, whole suite): exit $rc311 in $(elapsed $((SECONDS - t)))"
fi

rc312=0
if [ "${MFC_SKIP_PY312:-0}" = 1 ]; then
    echo "test.sh: leg 2 (Python 3.12, megatron-core 0.19.x) skipped: MFC_SKIP_PY312=1"
else
    t=$SECONDS
    venv=$(bash scripts/setup_env.sh --py312)
    (. "$venv/bin/activate" && python -m pytest -q "${WORKERS[@]}" --durations=15 "${CORE_SUBSET[@]}") || rc312=$?
    echo "test.sh: leg 2 (Python 3.12, megatron-core 0.19.x, core subset): exit $rc312 in $(elapsed $((SECONDS - t)))"
fi
echo "test.sh: total $(elapsed $((SECONDS - T0))); leg 1 exit $rc311, leg 2 exit $rc312"
[ "$rc311" = 0 ] && [ "$rc312" = 0 ]
