"""The save-directory lock on a filesystem without flock (Lustre mounted without ``-o flock``:
``flock`` fails with ENOSYS): chosen automatically, an exclusive-create lock file with flock's
take-over rule as far as this host can check it."""

import errno
import json
import logging
import socket
import subprocess
import sys

import pytest

from megatron_fixedcode.utils import lock_holders, locks
from megatron_fixedcode.utils.locks import LockHeld, lock_save_dir


@pytest.fixture
def no_flock(monkeypatch):
    def flock(fd, op):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(locks.fcntl, "flock", flock)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_without_flock_the_lock_is_an_exclusive_create_and_says_so(tmp_path, no_flock, caplog):
    caplog.set_level(logging.INFO)
    lock = lock_save_dir(tmp_path / "ckpt")
    lock_file = tmp_path / "ckpt" / locks.SAVE_DIR_LOCK_NAME
    assert json.loads(lock_file.read_text())["host"] == socket.gethostname()
    assert "no flock" in caplog.text and "exclusive create" in caplog.text
    with pytest.raises(LockHeld, match=r"is in use by another run: pid \d+ on host"):
        lock_save_dir(tmp_path / "ckpt")  # a second writer, while the first holds it
    lock.release()
    assert not lock_file.exists()
    lock_save_dir(tmp_path / "ckpt").release()  # free again


def test_without_flock_a_dead_holder_on_this_host_is_taken_over(tmp_path, no_flock):
    lock_file = tmp_path / "ckpt" / locks.SAVE_DIR_LOCK_NAME
    lock_file.parent.mkdir()
    lock_file.write_text(json.dumps({"host": socket.gethostname(), "pid": _dead_pid(), "started": "earlier"}))
    lock = lock_save_dir(tmp_path / "ckpt")
    assert lock.took_over and lock.took_over["started"] == "earlier"
    assert json.loads(lock_file.read_text())["started"] != "earlier"  # now ours
    lock.release()


def test_without_flock_a_holder_on_another_host_is_refused_naming_the_file(tmp_path, no_flock):
    lock_file = tmp_path / "ckpt" / locks.SAVE_DIR_LOCK_NAME
    lock_file.parent.mkdir()
    lock_file.write_text(json.dumps({"host": "node-elsewhere", "pid": _dead_pid()}))
    with pytest.raises(LockHeld, match=rf"on host node-elsewhere.*if that run is gone, remove {lock_file}"):
        lock_save_dir(tmp_path / "ckpt")
    assert lock_file.exists()  # not ours to remove


def test_with_flock_the_kernel_lock_is_used(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    lock = lock_save_dir(tmp_path / "ckpt")
    assert "no flock" not in caplog.text
    with pytest.raises(LockHeld):
        lock_save_dir(tmp_path / "ckpt")
    lock.release()


# --- a take-over rule that cannot block a restart forever ------------------------


def _lock_file(tmp_path, content: str, age_s: float = 0.0):
    import os
    import time

    lock_file = tmp_path / "ckpt" / locks.SAVE_DIR_LOCK_NAME
    lock_file.parent.mkdir()
    lock_file.write_text(content)
    if age_s:
        then = time.time() - age_s
        os.utime(lock_file, (then, then))
    return lock_file


@pytest.mark.parametrize("content", ["", '{"host": "node-a", "pi'], ids=["empty", "unparsable"])
def test_without_flock_an_empty_or_unparsable_lock_is_taken_over_after_a_grace(tmp_path, no_flock, caplog, content):
    """The holder was killed between creating the file and recording itself: every restart was refused."""
    lock_file = _lock_file(tmp_path, content)
    with pytest.raises(LockHeld, match=rf"an unknown process.*if that run is gone, remove {lock_file}"):
        lock_save_dir(tmp_path / "ckpt")  # a run that is creating it right now: refused
    _lock_file_age(lock_file, lock_holders.EMPTY_LOCK_GRACE_S + 5)
    caplog.set_level(logging.WARNING)
    lock = lock_save_dir(tmp_path / "ckpt")
    assert "records no holder" in caplog.text and str(lock_file) in caplog.text
    assert json.loads(lock_file.read_text())["host"] == socket.gethostname()
    lock.release()


def _lock_file_age(lock_file, age_s: float) -> None:
    import os
    import time

    then = time.time() - age_s
    os.utime(lock_file, (then, then))


def test_without_flock_a_reused_pid_is_taken_over_and_a_live_holder_is_refused(tmp_path, no_flock, caplog):
    """pid 1 is alive, but it is not the process that recorded itself (another start time)."""
    lock_file = _lock_file(
        tmp_path,
        json.dumps({"host": socket.gethostname(), "pid": 1, "pid_start": lock_holders.pid_start_time(1) + 12345}),
    )
    caplog.set_level(logging.WARNING)
    lock = lock_save_dir(tmp_path / "ckpt")
    assert "pid 1 is now another process" in caplog.text
    lock.release()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:  # a live holder with the start time it recorded: refused, naming it and the file to remove
        lock_file.write_text(
            json.dumps(
                {
                    "host": socket.gethostname(),
                    "pid": sleeper.pid,
                    "pid_start": lock_holders.pid_start_time(sleeper.pid),
                }
            )
        )
        with pytest.raises(LockHeld, match=rf"pid {sleeper.pid} on host .*if that run is gone, remove {lock_file}"):
            lock_save_dir(tmp_path / "ckpt")
        assert json.loads(lock_file.read_text())["pid"] == sleeper.pid
    finally:
        sleeper.kill()
        sleeper.wait()


def test_without_flock_the_same_slurm_job_requeued_on_another_node_takes_over(tmp_path, no_flock, caplog, monkeypatch):
    lock_file = _lock_file(
        tmp_path, json.dumps({"host": "node-elsewhere", "pid": 4242, "slurm_job_id": "777", "slurm_restart_count": "0"})
    )
    monkeypatch.setenv("SLURM_JOB_ID", "778")  # another job: refused
    with pytest.raises(LockHeld, match=rf"node-elsewhere.*if that run is gone, remove {lock_file}"):
        lock_save_dir(tmp_path / "ckpt")
    monkeypatch.setenv("SLURM_JOB_ID", "777")  # the same job, requeued here
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    caplog.set_level(logging.WARNING)
    lock = lock_save_dir(tmp_path / "ckpt")
    assert "this Slurm job (777) on node node-elsewhere" in caplog.text
    recorded = json.loads(lock_file.read_text())
    assert recorded["slurm_job_id"] == "777" and recorded["pid_start"] == lock_holders.pid_start_time(recorded["pid"])
    lock.release()


def test_without_flock_a_lock_recorded_without_a_start_time_is_judged_by_its_time(tmp_path, no_flock, caplog):
    """A lock written before start times were recorded: its pid is another process when that
    process started after the lock was taken."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock_file = _lock_file(
            tmp_path,
            json.dumps({"host": socket.gethostname(), "pid": sleeper.pid, "started": "2020-01-01T00:00:00+00:00"}),
        )
        caplog.set_level(logging.WARNING)
        lock_save_dir(tmp_path / "ckpt").release()
        assert f"pid {sleeper.pid} is now another process (it started after the lock was taken)" in caplog.text
        lock_file.write_text(
            json.dumps({"host": socket.gethostname(), "pid": sleeper.pid, "started": "2999-01-01T00:00:00+00:00"})
        )
        with pytest.raises(LockHeld, match=rf"pid {sleeper.pid} .*if that run is gone, remove {lock_file}"):
            lock_save_dir(tmp_path / "ckpt")
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_lock_kept_by_the_child_of_a_dead_run_names_that_child(tmp_path):
    """A run that died while a child it started still holds the flock through a descriptor the lock does
    not know of (a duplicate, a fork from native code): the refusal names the child's pid and command, so the
    user can end it."""
    import os
    import signal
    import time

    script = (
        "import os, time\n"
        "from megatron_fixedcode.utils.locks import lock_save_dir\n"
        f"lock = lock_save_dir({str(tmp_path)!r})\n"
        "copy = os.dup(lock._fd)\n"
        "if os.fork() == 0:\n"
        "    time.sleep(120)\n"
        "os._exit(0)\n"
    )
    parent = subprocess.run(
        [sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60
    )
    assert parent.returncode == 0
    child = None
    try:
        deadline = time.monotonic() + 20
        while child is None and time.monotonic() < deadline:
            out = subprocess.run(
                ["pgrep", "-f", "from megatron_fixedcode.utils.locks import lock_save_dir"],
                capture_output=True,
                text=True,
            ).stdout.split()
            child = int(out[0]) if out else None
        assert child is not None
        with pytest.raises(LockHeld) as e:
            lock_save_dir(tmp_path)
        message = str(e.value)
        assert f"a process it started still holds the lock: pid {child} on host" in message, message
        assert f"(kill {child})" in message and "from megatron_fixedcode.utils.locks import lock_save_dir" in message
    finally:
        if child:
            os.kill(child, signal.SIGKILL)


def test_a_forked_child_of_a_dead_run_does_not_keep_its_lock(tmp_path):
    """A DataLoader or checkpoint worker outliving a killed run: forked children close their copy of the
    lock's descriptor, so the next run takes the lock (logged as a take-over) instead of being refused."""
    script = (
        "import os, sys, time\n"
        "from megatron_fixedcode.utils.locks import lock_save_dir\n"
        f"lock = lock_save_dir({str(tmp_path)!r})\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    null = os.open(os.devnull, os.O_WRONLY)\n"
        "    os.dup2(null, 1), os.dup2(null, 2)  # the test reads the parent's output to its end\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "print(child, flush=True)\n"
        "os._exit(0)\n"
    )
    parent = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    child = int(parent.stdout.strip())
    try:
        lock = lock_save_dir(tmp_path)
        assert lock.held and lock.took_over["pid"] != child
        lock.release()
    finally:
        import os
        import signal

        os.kill(child, signal.SIGKILL)
