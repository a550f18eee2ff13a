"""--async-save with --use-persistent-ckpt-worker: the write goes on in the background, the ``latest``
marker moves only once every rank's files and checksums are complete, a ``kill -9`` during the write
leaves the previous checkpoint as the one that loads, and a failed write ends the run in one line."""

import os
import signal
import subprocess
import sys
import time
import types

import psutil
import pytest
import torch

from megatron_fixedcode import checkpoint
from megatron_fixedcode.checkpoint.async_save import AsyncSaves
from megatron_fixedcode.errors import SaveFailed
from tests.helpers import REPO
from tests.helpers.pretrain import TINY, assert_same_steps, pretrain, read_metrics, write_corpus

ASYNC = ["--async-save", "--use-persistent-ckpt-worker"]

# Run as the job's main script: megatron's writer (in the persistent worker, which re-imports this file as
# its __mp_main__) writes a few bytes of step 4's shard, says so, and hangs there until the job is killed.
KILLED_WHILE_WRITING = f"""
import os, sys, time
sys.path.insert(0, {str(REPO)!r})
from megatron.core.dist_checkpointing.strategies.filesystem_async import FileSystemWriterAsync
real = FileSystemWriterAsync.write_preloaded_data

def hangs_at_step_4(transform_list, **kwargs):
    path = str(kwargs["write_bucket"][0])
    if "iter_0000004" in path:
        open(path, "wb").write(b"partial")
        open(os.path.join(os.path.dirname(os.path.dirname(path)), "writing_step_4"), "w").close()
        time.sleep(600)
    return real(transform_list, **kwargs)

FileSystemWriterAsync.write_preloaded_data = staticmethod(hangs_at_step_4)
if __name__ == "__main__":
    from megatron_fixedcode.pretrain import main
    sys.exit(main())
"""


def _kill_job_while_writing(tmp_path, args: list[str]) -> None:
    script = tmp_path / "killed_while_writing.py"
    script.write_text(KILLED_WHILE_WRITING)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(script),
        *TINY,
        *args,
    ]
    job = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"},
    )
    marker, deadline = tmp_path / "ck" / "writing_step_4", time.time() + 240
    try:
        while not marker.exists():
            assert job.poll() is None, "the job ended before the write of step 4"
            assert time.time() < deadline, "no background write of step 4"
            time.sleep(0.2)
    finally:  # kill -9 of the whole job: launcher, ranks, their checkpoint workers and writers
        try:
            tree = [job.pid, *(c.pid for c in psutil.Process(job.pid).children(recursive=True))]
        except psutil.NoSuchProcess:  # it ended by itself: the assertion above says how
            tree = []
        for pid in tree:
            try:
                psutil.Process(pid).send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        job.wait(timeout=60)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("async_save")
    train, _ = write_corpus(tmp)
    common = ["--data-path", train, "--eval-iters", "0", "--train-iters", "6", "--save-interval", "2", *ASYNC]
    straight = pretrain(
        *common, "--save", str(tmp / "straight"), "--metrics-file", str(tmp / "straight.jsonl"), nproc=2, torchrun=True
    )
    _kill_job_while_writing(tmp, [*common, "--save", str(tmp / "ck")])
    after_kill = {
        "latest": checkpoint.latest_step(tmp / "ck"),
        "files": sorted(p.name for p in (tmp / "ck" / "iter_0000004").iterdir()),
    }
    resumed = pretrain(
        *common,
        "--save",
        str(tmp / "ck"),
        "--load",
        str(tmp / "ck"),
        "--metrics-file",
        str(tmp / "resumed.jsonl"),
        nproc=2,
        torchrun=True,
    )
    return types.SimpleNamespace(tmp=tmp, straight=straight, resumed=resumed, after_kill=after_kill)


@pytest.mark.slow
def test_kill_during_the_async_write_resumes_from_the_previous_checkpoint(runs):
    assert runs.after_kill["latest"] == 2, "the marker moved before step 4 was complete"
    assert "checksums.json" not in runs.after_kill["files"] and "metadata.json" not in runs.after_kill["files"]
    assert "start at step 2" in runs.resumed.stdout + runs.resumed.stderr  # the half-written step 4 is not loaded
    resumed = read_metrics(runs.tmp / "resumed.jsonl")
    assert [r["step"] for r in resumed] == [3, 4, 5, 6]
    assert_same_steps(read_metrics(runs.tmp / "straight.jsonl"), resumed)


@pytest.mark.slow
def test_async_checkpoints_verify_and_load_like_sync_ones(runs):
    log = runs.straight.stdout + runs.straight.stderr
    assert "writing checkpoint" in log and "written in the background" in log
    root = runs.tmp / "straight"
    assert checkpoint.latest_step(root) == 6
    kept = sorted(p.name for p in root.glob("iter_*"))
    assert kept == ["iter_0000004", "iter_0000006"]  # --ckpt-keep-last 2 pruned step 2 after step 6 was complete
    for name in kept:
        checkpoint.verify_checkpoint(root / name)
    assert checkpoint.read_trainer_state(str(root))["step"] == 6
    assert checkpoint.verified_step(root) == 6


class _FailingQueue:
    def __init__(self, target):
        self.in_flight = (4, target, 0.0)

    def finalize(self, blocking=False):
        from torch.distributed.checkpoint.api import CheckpointException

        raise CheckpointException("write", {0: OSError(28, "No space left on device", str(self.in_flight[1]))})


def test_a_failed_background_write_is_one_line_and_removes_the_partial_directory(tmp_path):
    target = tmp_path / "iter_0000004"
    target.mkdir()
    trainer = types.SimpleNamespace(
        cfg=types.SimpleNamespace(checkpoint=types.SimpleNamespace(save=str(tmp_path), async_save=False)),
        ranks={"rank": 0},
    )
    saves = AsyncSaves(trainer)
    saves.queue = _FailingQueue(target)
    with pytest.raises(SaveFailed) as failed:
        saves.poll()
    message = str(failed.value)
    assert "\n" not in message and message.startswith("--async-save of step 4: cannot write checkpoint")
    assert "no space left on device" in message and "the last complete checkpoint is kept" in message
    assert not target.exists()


@pytest.mark.slow
def test_the_background_write_saves_the_step_it_was_started_at(single_rank, tmp_path):
    """On the CPU megatron's staging copy is the live tensor: the request's tensors are copied before the
    next step changes them (here at once, while the worker is still starting)."""
    from megatron_fixedcode.checkpoint.async_save import AsyncSaveQueue
    from tests.helpers.checkpoints import make_trained_parts, weights

    chunks, opt, sched = make_trained_parts(single_rank)
    state = {"step": 2, "tokens": 8, "layout": {"world_size": 1, "tp_size": 1, "pp_size": 1, "dp_size": 1}}
    queue = AsyncSaveQueue()
    try:
        checkpoint.save_checkpoint(str(tmp_path), 2, chunks, opt, sched, state, async_queue=queue)
        saved = weights(chunks)
        for p in chunks[0].module.parameters():
            p.data.add_(1.0)  # the next step
        assert checkpoint.latest_step(tmp_path) is None  # not before the finalize
        assert queue.finalize(blocking=True)[0] == 2
    finally:
        queue.close()
    assert checkpoint.latest_step(tmp_path) == 2
    checkpoint.verify_checkpoint(tmp_path / "iter_0000002")
    fresh, opt2, sched2 = make_trained_parts(single_rank)
    checkpoint.load_checkpoint(str(tmp_path), fresh, opt2, sched2)
    for key, value in weights(fresh).items():
        assert torch.equal(value, saved[key]), key
