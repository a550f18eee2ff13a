"""What a node's launch leaves running is found by its token and ended, re-parented or not
(megatron_fixedcode/recovery/job_processes.py; examples/slurm_node.sh runs it after its launcher)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from megatron_fixedcode.recovery import job_processes
from megatron_fixedcode.recovery.job_processes import TOKEN_ENV, is_trainer_rank, launch_processes

# a child that starts a grandchild (sleeping) and exits: the grandchild is re-parented, as a rank whose agent died
ORPHAN = (
    "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'] + sys.argv[1:],"
    " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid, flush=True)"
)


def _orphan(token: str, *argv: str, **env: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", ORPHAN, *argv],
        env={**os.environ, TOKEN_ENV: token, **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(out.split()[0])


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def test_a_reparented_process_of_the_launch_is_found_by_its_token_and_ended(capsys):
    token, other = uuid.uuid4().hex, uuid.uuid4().hex
    mine, theirs = _orphan(token), _orphan(other)
    try:
        assert launch_processes(token) == [mine]
        assert job_processes.main([token, "--grace", "2", "--label", "node 1"]) == 0
        assert not _alive(mine) and _alive(theirs), "only the launch's own processes end"
        assert f"node 1: ended what it left running: {mine} (python" in capsys.readouterr().err
    finally:
        job_processes.main([other, "--grace", "0"])
    deadline = time.monotonic() + 5  # SIGKILL is delivered asynchronously
    while _alive(theirs) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(theirs)


def test_a_killed_launchers_trainer_ranks_are_waited_for_then_the_rest_ended(capsys):
    """--wait-trainers: a trainer rank (LOCAL_RANK set by the agent, the trainer module on its command line)
    is left to finish; a rank monitor left beside it is ended after it."""
    token = uuid.uuid4().hex
    trainer = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(3)", "-m", "megatron_fixedcode.pretrain"],
        env={**os.environ, TOKEN_ENV: token, "LOCAL_RANK": "0"},
    )
    monitor = _orphan(token)
    time.sleep(0.3)
    assert is_trainer_rank(trainer.pid) and not is_trainer_rank(monitor)
    started = time.monotonic()
    job_processes.main([token, "--wait-trainers", "--grace", "2"])
    assert trainer.wait(timeout=1) == 0, "the trainer rank was not ended: it finished"
    assert time.monotonic() - started >= 2 and not _alive(monitor)
    err = capsys.readouterr().err
    assert f"waiting for {trainer.pid}" in err and f"ended what it left running: {monitor}" in err


def test_a_process_that_ignores_term_is_killed_after_the_grace():
    token = uuid.uuid4().hex
    stubborn = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"],
        env={**os.environ, TOKEN_ENV: token},
    )
    time.sleep(0.5)
    assert job_processes.end_processes(launch_processes(token), grace=0.5) == [stubborn.pid]
    assert stubborn.wait(timeout=5) == -9


def test_the_killed_launchers_sockets_are_removed_and_nothing_else():
    tmp = Path(tempfile.gettempdir())
    pid = 4_000_000 + os.getpid() % 100_000  # no live process has it
    sockets = [tmp / f"_ft_launcher{pid}.socket", tmp / f"_ft_launcher{pid}_rmon0.socket"]
    plain = tmp / f"_ft_launcher{pid}_notes.socket"  # a regular file of that name is not ft_launcher's
    servers = []
    for path in sockets:
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        servers.append(s)
    plain.write_text("x")
    try:
        removed = job_processes.remove_launcher_sockets([pid])
        assert sorted(removed) == sorted(p.name for p in sockets) and plain.exists()
        assert not any(p.exists() for p in sockets)
    finally:
        plain.unlink()
        for s in servers:
            s.close()
