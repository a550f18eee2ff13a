"""Issue 15, data side: one writer per output (locks), shard/.idx consistency and token-id
checks at start-up, helpers that die with their parent, --save pre-flight checks, and bounded
memory for huge documents. Each test fails on the code before the fix."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from megatron_fixedcode.locks import LockHeld, PathLock, lock_output_prefix, lock_save_dir

REPO = Path(__file__).resolve().parents[1]


def _python(code: str, **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=str(REPO),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"helper exited early: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for {path}")
        time.sleep(0.05)


# --------------------------------------------------------------------------- 1: locks

def test_lock_refuses_second_holder_and_names_it(tmp_path):
    first = lock_output_prefix(tmp_path / "out")
    with pytest.raises(LockHeld, match=rf"--output-prefix .*out is in use by another run: pid {os.getpid()} on host"):
        lock_output_prefix(tmp_path / "out")
    first.release()
    assert not (tmp_path / "out.lock").exists()  # no debris after a clean release
    lock_output_prefix(tmp_path / "out").release()


def test_lock_of_killed_holder_is_taken_over(tmp_path):
    ready = tmp_path / "ready"
    holder = _python(f"""
        import time
        from megatron_fixedcode.locks import lock_save_dir
        lock = lock_save_dir({str(tmp_path / 'ckpt')!r})
        open({str(ready)!r}, 'w').close()
        time.sleep(600)
    """)
    _wait_for(ready, holder)
    with pytest.raises(LockHeld, match=rf"--save .*ckpt is in use by another run: pid {holder.pid} "):
        lock_save_dir(tmp_path / "ckpt")
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    lock = lock_save_dir(tmp_path / "ckpt")  # the kernel released the dead holder's flock
    assert lock.took_over["pid"] == holder.pid
    lock.release()
