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
import os
from pathlib import Path

SAMPLES_SUFFIX = " vs samples"


def drop_jsonl_after(path: str | os.PathLike, step: int) -> int:
    """Keep the lines of ``path`` whose ``step`` is at most ``step`` (and none that does not parse:
    the torn last line of a killed writer); returns how many lines were dropped."""
    path = Path(path)
    if not path.exists():
        return 0
    kept, dropped = [], 0
    for line in path.read_text().splitlines():
        try:
            keep = json.loads(line).get("step", step) <= step
        except (ValueError, AttributeError):
            keep = False
        if keep:
            kept.append(line + "\n")
        elif line.strip():
            dropped += 1
    if dropped:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(kept))
        os.replace(tmp, path)
    return dropped


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
