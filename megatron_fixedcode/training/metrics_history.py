"""One record per step across attempts: what an earlier attempt recorded after the checkpoint a
run resumes from is dropped before the run records anything.

A job killed at step 13 after a checkpoint at step 10 has already written steps 11-13 to
``metrics.jsonl`` and TensorBoard; its resubmission trains steps 11-13 again. Without this, both
attempts' steps 11-13 stay, with no marker. TensorBoard's own ``purge_step`` cannot serve: its START
event purges every tag from that step on, so the ``... vs samples`` series (whose x axis is the
sample count, Megatron-LM's layout) would lose its history. The event files are rewritten instead
(each to a temporary file, then renamed over the original). W&B cannot drop logged steps: its run
keeps the first attempt's values up to its last step (docs/training.md)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from megatron_fixedcode.utils.files import free_space_text

SAMPLES_SUFFIX = " vs samples"
logger = logging.getLogger(__name__)


def drop_jsonl_after(path: str | os.PathLike, step: int) -> int:
    """Keep the lines of ``path`` whose ``step`` is at most ``step`` (and none that does not parse:
    the torn last line of a killed writer); returns how many lines were dropped. Dropped lines that all
    follow the last kept one (the usual case: steps are appended in order) are cut off in place, which
    needs no free space."""
    path = Path(path)
    if not path.exists():
        return 0
    lines = path.read_bytes().splitlines(keepends=True)
    keep = [_at_most(line, step) for line in lines]
    dropped = [i for i, (line, k) in enumerate(zip(lines, keep)) if not k and line.strip()]
    if not dropped:
        return 0
    last_kept = max((i for i, k in enumerate(keep) if k), default=-1)
    if dropped[0] > last_kept:
        os.truncate(path, sum(len(line) for line in lines[: last_kept + 1]))
    else:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(b"".join(line if line.endswith(b"\n") else line + b"\n" for line, k in zip(lines, keep) if k))
        os.replace(tmp, path)
    return len(dropped)


def _at_most(line: bytes, step: int) -> bool:
    try:
        return json.loads(line).get("step", step) <= step
    except (ValueError, AttributeError):
        return False


def drop_tensorboard_after(directory: str | os.PathLike, step: int, samples: int) -> int:
    """Drop the scalar events after ``step`` (after ``samples`` for the ``... vs samples`` tags) from
    every event file in ``directory``; returns how many were dropped."""
    directory = Path(directory)
    files = sorted(directory.glob("events.out.tfevents.*")) if directory.is_dir() else []
    if not files:
        return 0
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    total = 0
    for path in files:
        kept, dropped = [], 0
        for raw in RawEventFileLoader(str(path)).Load():
            event = Event.FromString(raw)
            values = event.summary.value if event.HasField("summary") else ()
            limit = samples if values and values[0].tag.endswith(SAMPLES_SUFFIX) else step
            if values and event.step > limit:
                dropped += 1
            else:
                kept.append(raw)
        if dropped:
            tmp = path.with_name(path.name + ".tmp")
            with open(tmp, "wb") as f:
                writer = RecordWriter(f)
                for raw in kept:
                    writer.write(raw)
                writer.flush()
            os.replace(tmp, path)
            total += dropped
    return total


class MetricsFile:
    """``metrics.jsonl``, one line per step, appended whole or not at all. A full disk (or any write
    error) does not end a multi-day run over its log: the partial line is cut off, one warning names
    the file, the error and the free space, later steps are tried again, and the line that resumes
    writing names the steps that are missing. Checkpoints fail on their own (SaveFailed)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._missing: list[int] | None = None  # [first, last] step not written

    def write(self, record: dict) -> None:
        data = memoryview((json.dumps(record) + "\n").encode())
        start = os.lseek(self._fd, 0, os.SEEK_END)
        step = record.get("step")
        try:
            while data:
                data = data[os.write(self._fd, data) :]
        except OSError as e:
            os.ftruncate(self._fd, start)
            if self._missing is None:
                self._missing = [step, step]
                logger.warning(
                    "cannot write %s (%s; %s): training goes on, the steps from %s on are not recorded "
                    "there until a write succeeds",
                    self.path,
                    e.strerror,
                    free_space_text(self.path),
                    step,
                )
            else:
                self._missing[1] = step
            return
        if self._missing is not None:
            logger.warning(
                "%s written again from step %s: steps %s-%s are missing there", self.path, step, *self._missing
            )
            self._missing = None

    def close(self) -> None:
        os.close(self._fd)
