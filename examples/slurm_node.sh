#!/usr/bin/env bash
# One node's share of a Slurm launch. `srun --ntasks-per-node 1` runs this once on every node of the
# allocation with the per-node command as arguments (torchrun ... -m megatron_fixedcode.pretrain ...,
# built by mfc_launch in examples/slurm_common.sh). It appends this node's output to
# $MFC_NODE_LOG_DIR/node<SLURM_NODEID>.log (still echoed to stdout, which Slurm collects into
# slurm-<job name>-<job id>.out, less torchrun's own failure report), runs the command and waits for it.
# Then it ends what the launch left running (megatron_fixedcode/recovery/job_processes.py: every process of
# the launch carries MFC_LAUNCH_TOKEN; a cluster that tracks a step's processes by parent misses those
# re-parented to init): at once after the launcher exited, or, when the launcher itself was killed (its agent
# lost), after its trainer ranks, which go on with their peers, have ended. It exits with the launcher's code.
# Signals: Slurm sends TERM (scancel, preemption; the launcher too, at a time limit) to every process of
# the step. The tee and torchrun ignore both (and the trainer's --exit-signal), so the log keeps what the trainer prints after the signal
# and torchrun exits with its workers' status (0 after a clean checkpoint) instead of 1 on its own
# SIGTERM handler (TORCHELASTIC_SIGNALS_TO_HANDLE); the trainer ranks install their own handlers
# (--exit-signal-handler, megatron_fixedcode/pretrain.py), from their first import on.
set -euo pipefail
node=${SLURM_NODEID:-0}
exit_signal=${MFC_EXIT_SIGNAL:-SIGTERM}   # the trainer's --exit-signal (the launcher's time-limit signal)
trap '' TERM USR1 "${exit_signal#SIG}"
# What reaches the Slurm output leaves out torchrun's own ~40-line ChildFailedError report (a traceback of
# torchrun, then the failed ranks' exit codes, which the launcher's last lines say in one) and torch's C++
# "[enforce fail at inline_container.cc...]" after a checkpoint write the trainer already reported (a full
# disk), and ft_launcher's INFO records (its configuration, rendezvous rounds); the node log keeps them all.
# A rank's own traceback ("[rankN]: ...") passes untouched; the launcher's warnings and errors pass too.
slurm_output_filter() {
    awk -v log_note="${1:-}" '
    function flush() { printf "%s", buf; buf = ""; n = 0 }
    state == 0 && /^Traceback \(most recent call last\):$/ { state = 1; buf = $0 "\n"; n = 1; next }
    state == 1 && /^torch\.distributed\.elastic\.multiprocessing\.errors\.ChildFailedError/ {
        state = 2; rules = 0; buf = ""; n = 0; next }
    state == 1 && (/^[ \t]/ && n < 500) { buf = buf $0 "\n"; n++; next }
    state == 1 { flush(); state = 0 }
    state == 2 { if ($0 ~ /^=+$/ && ++rules == 2) { state = 0
                     print "torchrun: a worker failed; its report is" log_note; fflush() }
                 next }
    /enforce fail at inline_container\.cc/ && !/Error: / { next }
    cont && (/^  [a-z_]+ +: / || /^$/) { next }
    { cont = 0 }
    /^\[[0-9: ,-]+\] \[INFO\] \[(ft_launcher|RankMonServer)/ { cont = 1; next }
    { print; fflush() }
    END { flush() }'
}
if [[ -n ${MFC_NODE_LOG_DIR:-} ]]; then
    mkdir -p "$MFC_NODE_LOG_DIR"
    log=$MFC_NODE_LOG_DIR/node$node.log
    exec > >(trap '' TERM USR1 "${exit_signal#SIG}"; tee -a "$log" | slurm_output_filter " in $log") 2>&1
else
    exec > >(trap '' TERM USR1 "${exit_signal#SIG}"; slurm_output_filter " left out here") 2>&1
fi
log_filter=$!
handled=SIGINT,SIGHUP,SIGQUIT   # torchrun's own list less the trainer's exit signal (the ranks handle that one)
handled=$(tr , '\n' <<<"$handled" | grep -vx "$exit_signal" | paste -sd, -)
export TORCHELASTIC_SIGNALS_TO_HANDLE=${TORCHELASTIC_SIGNALS_TO_HANDLE:-$handled}
# torch >= 2.10's torchrun takes the list as --signals-to-handle (its default, with SIGTERM, overrides the variable)
if [[ ${1##*/} == torchrun ]] && "$1" --help 2>/dev/null | grep -q -- --signals-to-handle; then
    set -- "$1" --signals-to-handle "$TORCHELASTIC_SIGNALS_TO_HANDLE" "${@:2}"
fi
export MFC_LAUNCH_TOKEN=${SLURM_JOB_ID:-0}.${SLURM_STEP_ID:-0}.$node.$$   # after the log filter: it is not ended
printf '[%(%F %T)T] %s\n' -1 "node $node of ${SLURM_NNODES:-1} on $(hostname) (${SLURMD_NODENAME:-?}): task ${SLURM_PROCID:-0}, job ${SLURM_JOB_ID:-none}, restart ${SLURM_RESTART_COUNT:-0}: $*"
"$@" &
launcher=$!
while :; do   # a signal that is not ignored interrupts `wait`: wait again while the launcher lives
    wait "$launcher" && rc=0 || rc=$?
    kill -0 "$launcher" 2>/dev/null || break
done
reap=(python -m megatron_fixedcode.recovery.job_processes "$MFC_LAUNCH_TOKEN" --label "node $node" --launcher-pid "$launcher")
if ((rc > 128)); then
    printf '[%(%F %T)T] %s\n' -1 "node $node: the launcher ${1##*/} was killed (signal $((rc - 128))): its trainer ranks go on without it; ending the rest once they have ended"
    reap+=(--wait-trainers)
fi
"${reap[@]}" || printf '[%(%F %T)T] %s\n' -1 "node $node: could not look for what the launch left running"
exec >&- 2>&-
wait "$log_filter" 2>/dev/null || true   # the node log's last lines written before the task ends
exit "$rc"
