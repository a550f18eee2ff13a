"""Which nodes a relaunch on fewer nodes runs on (issue 62), with fake ``scontrol`` and ``sinfo`` first on PATH:
Slurm's lost nodes, the attempts' bad ones, the decision and the launcher's ``KEY=value`` lines."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_fixedcode.recovery.attempt_reports import write_failure_report
from megatron_fixedcode.recovery.attempts import Attempts
from megatron_fixedcode.recovery.node_plan import NodeCount
from megatron_fixedcode.recovery.usable_nodes import decide, main, usable_state
from tests.helpers import REPO

# 2 GPUs a node, no model parallelism, 16 microbatches of 1 a step: 1, 2, 4 or 8 nodes keep the global batch
CONFIG = {"global_batch_size": 16, "micro_batch_size": 1, "tensor_model_parallel_size": 1}
GPUS = 2
COLLECTIVE = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.3]:4242"
CUDA = "CUDA error: an illegal memory access was encountered"

SCONTROL = """#!/bin/bash
d=$(dirname "$0")
echo "scontrol $*" >>"$d/calls"
case "$1 $2" in
    "show job") [[ -f $d/job.fail ]] && { cat "$d/job.fail" >&2; exit 1; }; cat "$d/job.txt" ;;
    "show hostnames") cat "$d/hostnames.txt" ;;
    *) echo "fake scontrol: $*" >&2; exit 3 ;;
esac
"""
SINFO = """#!/bin/bash
d=$(dirname "$0")
echo "sinfo $*" >>"$d/calls"
cat "$d/sinfo.txt"
"""


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    """slurm(states, batch_host): the fake Slurm commands for job 4242 on nodes n1... in those sinfo states."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("scontrol", SCONTROL), ("sinfo", SINFO)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    monkeypatch.delenv("SLURM_JOB_NUM_NODES", raising=False)

    def write(states: list[str], batch_host: str = "n1") -> Path:
        nodes = [f"n{i}" for i in range(1, len(states) + 1)]
        (bin_dir / "job.txt").write_text(
            f"JobId=4242 JobName=pretrain JobState=RUNNING ReqNodeList=(null) ExcNodeList=(null) "
            f"NodeList=n[1-{len(nodes)}] BatchHost={batch_host} NumNodes={len(nodes)} WorkDir=/w\n"
        )
        (bin_dir / "hostnames.txt").write_text("\n".join(nodes) + "\n")
        (bin_dir / "sinfo.txt").write_text("".join(f"{n} {s}\n" for n, s in zip(nodes, states)))
        return bin_dir

    return write


def _attempts(tmp_path, nodes: int, outcomes: list[dict[int, str | None]], same_step: int | None = None) -> str:
    """An attempts' record of failed attempts on ``nodes`` nodes of GPUS ranks; ``outcomes[a]``: rank -> its
    report's error (None: no report) for attempt ``a``; a rank not named reports a peer's collective failure.
    Attempts fail at steps 7 and 8 in turn, or each after step ``same_step``."""
    path = str(tmp_path / "attempts.json")
    hosts = [f"n{1 + rank // GPUS}" for rank in range(nodes * GPUS)]
    record = Attempts(path)
    for attempt, outcome in enumerate(outcomes):
        record.start(attempt, 100.0 * attempt, hosts, "4242.0")
        record.resumed(0 if attempt == 0 else 5)
        record.step_done(6 + attempt % 2 if same_step is None else same_step, 1.0, 100.0 * attempt + 50)
        for rank in range(len(hosts)):
            error = outcome.get(rank, COLLECTIVE)
            if error is not None:
                write_failure_report(path, attempt, rank, 8, error)
        if 0 not in outcome or outcome[0] is not None:
            record.end(1, "a rank failed", 100.0 * attempt + 60)  # rank 0 alive: it records the end
    return path


def _decide(attempts_file, **kw):
    return decide("4242", attempts_file, CONFIG, gpus_per_node=GPUS, **kw)


def test_a_down_node_and_a_drained_one_are_cut_out(slurm, tmp_path):
    bin_dir = slurm(["alloc", "mix", "down*", "comp", "drain", "alloc"])
    d = _decide(_attempts(tmp_path, 6, [{}]), start_nodes=6)
    assert d.lost == {"n3": "Slurm reports it down, not responding (down*)", "n5": "Slurm reports it drained (drain)"}
    assert d.bad == {}
    assert d.relaunch and d.count == NodeCount(4, 8, 2)
    assert d.nodes == ["n1", "n2", "n4", "n6"]
    assert d.why == (
        "2 node(s) cut out (n3: Slurm reports it down, not responding (down*) | n5: Slurm reports it drained "
        "(drain)); 4 usable node(s): 4 (dp 8, 2 microbatches per rank) keeps global batch 16"
    )
    assert (bin_dir / "calls").read_text().splitlines() == [
        "scontrol show job -o 4242",
        "scontrol show hostnames n[1-6]",
        "sinfo -h -N -n n1,n2,n3,n4,n5,n6 -o %N %t",
    ]


@pytest.mark.parametrize(
    "state, usable",
    [("idle", True), ("alloc", True), ("mix", True), ("comp", True), ("mix-", True), ("resv", True)]
    + [("down", False), ("down*", False), ("alloc*", False), ("drng", False), ("drain", False), ("fail", False)]
    + [("failg", False), ("maint", False), ("unk", False), ("unk*", False), ("idle~", False), ("boot^", False)],
)
def test_which_slurm_states_are_usable(state, usable):
    assert usable_state(state) is usable


def test_a_node_whose_ranks_failed_at_two_attempts_in_a_row_is_bad(slurm, tmp_path):
    slurm(["alloc"] * 4, batch_host="n2")
    # attempt 0: n3's ranks (4, 5) died or hung; attempt 1: its rank 4 reports a CUDA error of its own
    attempts = _attempts(tmp_path, 4, [{4: None, 5: None}, {4: CUDA}])
    d = _decide(attempts)
    assert d.lost == {}
    assert d.bad == {
        "n3": f"its ranks failed at attempts 0 and 1 (attempt 0: ranks 4-5 died or hung; attempt 1: rank 4: {CUDA})"
    }
    # 3 usable nodes: dp 6 does not divide 16 microbatches, 2 nodes do; the batch host n2 first (the rendezvous)
    assert d.relaunch and d.count == NodeCount(2, 4, 4) and d.nodes == ["n2", "n1"]
    assert d.why.endswith("; 3 usable node(s): 2 (dp 4, 4 microbatches per rank) keeps global batch 16")
    # --batch-host (else SLURMD_NODENAME, else the job's BatchHost) names the rendezvous
    assert _decide(attempts, batch_host="n4").nodes == ["n4", "n1"]


def test_the_same_step_failing_twice_on_a_node_is_the_runs_failure_not_the_nodes(slurm, tmp_path):
    """Attempts.refusal ends the job for it (a restart cannot fix it): no node is blamed, nothing relaunched."""
    slurm(["alloc"] * 4, batch_host="n2")
    d = _decide(_attempts(tmp_path, 4, [{4: None, 5: None}, {4: CUDA}], same_step=7))
    assert (d.relaunch, d.bad) == (False, {})


def test_one_failure_only_is_not_bad(slurm, tmp_path):
    slurm(["alloc"] * 4)
    healthy = (
        "nothing was cut out: the job's 4 node(s) are up and none failed at the last two attempts (a failure on "
        "healthy nodes is not a node loss: no relaunch on fewer nodes)"
    )
    once = _decide(_attempts(tmp_path, 4, [{4: None, 5: None}]))
    assert (once.relaunch, once.bad, once.why) == (False, {}, healthy)
    # two failures in a row, of different nodes
    (tmp_path / "b").mkdir()
    other = _decide(_attempts(tmp_path / "b", 4, [{4: None}, {6: CUDA}]))
    assert (other.relaunch, other.bad, other.why) == (False, {}, healthy)
    # the same node twice, with a success between: not the last two attempts in a row
    (tmp_path / "c").mkdir()
    path = _attempts(tmp_path / "c", 4, [{4: None}, {}, {4: None}])
    record = Attempts.read(path)
    record.records[1]["ended"] = {"code": 0, "error": None, "at": 160.0}
    record.write()
    assert _decide(path).bad == {}


def test_all_healthy_is_no_node_loss_and_no_relaunch(slurm, tmp_path):
    slurm(["alloc", "mix", "idle", "comp"])
    # every rank reported a peer's failure (or was waiting in its section): no rank to blame, twice
    overdue = "still in its 'step' section after 590 s"
    d = _decide(_attempts(tmp_path, 4, [{}, {3: overdue, 7: "CheckpointException ranks:dict_keys([1])"}]))
    assert not d.relaunch and d.nodes == [] and d.count is None and d.cut_out == {}
    assert d.why.startswith("nothing was cut out: the job's 4 node(s) are up")
    # no rank reported at all (a cancel, a time limit): nobody to blame either
    (tmp_path / "none").mkdir()
    assert _decide(_attempts(tmp_path / "none", 4, [{r: None for r in range(8)}] * 2)).bad == {}


def test_fewer_usable_nodes_than_min_nodes(slurm, tmp_path):
    slurm(["alloc", "down", "alloc", "fail"])
    d = _decide(_attempts(tmp_path, 4, [{}]), min_nodes=3)
    assert not d.relaunch and d.nodes == [] and list(d.cut_out) == ["n2", "n4"]
    assert d.why == (
        "2 node(s) cut out (n2: Slurm reports it down (down) | n4: Slurm reports it failed (fail)); "
        "2 usable node(s), fewer than MIN_NODES=3: no relaunch on fewer nodes"
    )
    # 3 of 4 nodes usable, MIN_NODES 3: 3 nodes (dp 6) do not divide 16 microbatches
    slurm(["alloc", "alloc", "alloc", "drng"])
    assert _decide(_attempts(tmp_path, 4, [{}]), min_nodes=3).why.endswith(
        "; no node count from 3 down to 3 keeps global batch 16: its data-parallel size (nodes x 2 GPUs / model "
        "parallel 1) must be whole and divide its 16 microbatches of 1"
    )


def test_the_batch_host_lost_is_no_relaunch(slurm, tmp_path):
    slurm(["down*", "alloc", "alloc", "alloc"])
    d = _decide(_attempts(tmp_path, 4, [{0: None, 1: None}]))
    assert not d.relaunch and d.lost == {"n1": "Slurm reports it down, not responding (down*)"}
    assert d.why == (
        "1 node(s) cut out (n1: Slurm reports it down, not responding (down*)); the batch host n1 itself is cut "
        "out: no relaunch on fewer nodes (requeue)"
    )


def test_a_node_slurm_removed_from_the_job_is_lost(slurm, tmp_path):
    slurm(["alloc", "alloc", "alloc"])  # the attempts ran on n1-n4; Slurm's list has n1-n3 (--no-kill)
    d = _decide(_attempts(tmp_path, 4, [{6: None, 7: None}]))
    assert d.lost == {"n4": "no longer in the job's node list (Slurm removed it)"}
    assert d.relaunch and d.nodes == ["n1", "n2"]


def _cli(tmp_path, *extra, attempts=None):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    args = ["--job", "4242", "--attempts", attempts or str(tmp_path / "none.json"), "--config-json", str(config)]
    return [*args, "--gpus-per-node", str(GPUS), *extra]


def test_the_cli_prints_shell_lines_bash_reads(slurm, tmp_path, monkeypatch):
    bin_dir = slurm(["alloc", "alloc", "alloc", "drain"], batch_host="n3")
    attempts = _attempts(tmp_path, 4, [{}])
    argv = _cli(tmp_path, "--min-nodes", "2", attempts=attempts)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURMD_NODENAME": "n3", "SLURM_JOB_NUM_NODES": "4"}
    command = f"{shlex.quote(sys.executable)} -m megatron_fixedcode.recovery.usable_nodes {shlex.join(argv)}"
    script = f'eval "$({command})" && printf "%s\\n" "$MFC_RELAUNCH" "$MFC_RELAUNCH_NODES" "$MFC_CUT_OUT"'
    out = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["1", "n3,n1", "n4: Slurm reports it drained (drain)"]
    # the same lines, read with shlex
    monkeypatch.setenv("SLURMD_NODENAME", "n3")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "4")
    lines = _main_lines(argv)
    assert lines == {
        "MFC_RELAUNCH": "1",
        "MFC_RELAUNCH_WHY": "1 node(s) cut out (n4: Slurm reports it drained (drain)); 3 usable node(s): 2 (dp 4, "
        "4 microbatches per rank) keeps global batch 16",
        "MFC_RELAUNCH_NODES": "n3,n1",
        "MFC_RELAUNCH_COUNT": "2",
        "MFC_RELAUNCH_DP": "4",
        "MFC_RELAUNCH_MICROBATCHES": "4",
        "MFC_RENDEZVOUS_HOST": "n3",
        "MFC_CUT_OUT_NODES": "n4",
        "MFC_CUT_OUT": "n4: Slurm reports it drained (drain)",
    }


def _main_lines(argv) -> dict[str, str]:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(argv) == 0
    return dict(shlex.split(line)[0].split("=", 1) for line in buf.getvalue().splitlines())


def test_a_slurm_command_that_fails_is_no_relaunch(slurm, tmp_path):
    bin_dir = slurm(["alloc"] * 2)
    (bin_dir / "job.fail").write_text("slurm_load_jobs error: Invalid job id specified\n")
    lines = _main_lines(_cli(tmp_path))
    assert lines["MFC_RELAUNCH"] == "0" and lines["MFC_RELAUNCH_NODES"] == "" and lines["MFC_RELAUNCH_COUNT"] == ""
    assert lines["MFC_RELAUNCH_WHY"] == (
        "`scontrol show job -o 4242` exited 1: slurm_load_jobs error: Invalid job id specified: no relaunch on "
        "fewer nodes"
    )


@pytest.mark.parametrize(
    "change, message",
    [
        (("--gpus-per-node", "0"), "usable_nodes: --gpus-per-node 0: give whole numbers of 1 or more"),
        (("--job", "42; rm"), "usable_nodes: --job '42; rm': give a Slurm job id"),
        (("--config-json", "/nonexistent.json"), "usable_nodes: --config-json /nonexistent.json: [Errno 2] No such"),
        (("--min-nodes", "x"), "usable_nodes: argument --min-nodes: invalid int value: 'x'"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(slurm, tmp_path, capsys, change, message):
    argv = _cli(tmp_path)
    key, value = change
    argv = argv[: argv.index(key) + 1] + [value] + argv[argv.index(key) + 2 :] if key in argv else argv + [key, value]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr()
    assert exit_.value.code == 2 and err.out == ""
    assert len(err.err.splitlines()) == 1 and err.err.startswith(message)


def test_a_node_that_failed_at_the_last_attempt_only_is_left_out_first(slurm, tmp_path):
    slurm(["alloc", "alloc", "alloc", "down"])
    # n4 lost; n2's ranks died at the last attempt only: not bad, but when a node must be left out, it is
    d = _decide(_attempts(tmp_path, 4, [{2: None, 3: None}]))
    assert d.bad == {} and list(d.lost) == ["n4"]
    assert d.relaunch and d.count == NodeCount(2, 4, 4) and d.nodes == ["n1", "n3"]
