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

from megatron_fixedcode import locks
from megatron_fixedcode.locks import LockHeld, lock_save_dir


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
