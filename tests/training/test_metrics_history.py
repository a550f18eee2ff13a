"""One record per step: a run that resumes from a checkpoint (or starts again after a crash before
its first one) drops what the earlier attempt recorded after that step, from metrics.jsonl and from
TensorBoard's event files, and says so in one line; the exit record a launcher reads."""
from __future__ import annotations

import json

import pytest

from megatron_fixedcode.training.metrics_history import drop_jsonl_after, drop_tensorboard_after
from tests.helpers.pretrain import data_args, pretrain, read_metrics, write_corpus


def test_jsonl_keeps_the_steps_up_to_the_checkpoint_and_drops_a_torn_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": s / 10}) + "\n" for s in range(1, 6)) + '{"step": 6, "lo')
    assert drop_jsonl_after(path, 3) == 3
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]
    assert drop_jsonl_after(path, 3) == 0 and drop_jsonl_after(tmp_path / "absent.jsonl", 3) == 0


def test_tensorboard_drops_steps_after_the_checkpoint_and_keeps_the_samples_axis(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    def write(first, last, offset):
        w = SummaryWriter(str(tmp_path))
        for s in range(first, last + 1):
            w.add_scalar("lm loss", offset + s, s)
            w.add_scalar("lm loss vs samples", offset + s, 4 * s)  # global batch 4: x = samples
        w.close()

    write(1, 7, 0.0)
    assert drop_tensorboard_after(tmp_path, 5, 20) == 4  # steps 6, 7 of both series
    write(6, 8, 10.0)
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("lm loss")] == [(s, float(s)) for s in range(1, 6)] + [
        (6, 16.0), (7, 17.0), (8, 18.0)]
    assert [e.step for e in acc.Scalars("lm loss vs samples")] == [4 * s for s in range(1, 9)]


@pytest.mark.slow
def test_a_resumed_run_records_each_step_once(tmp_path, monkeypatch):
    """Steps 1-6 with checkpoints at 3 and 6, then a resume from step 3 (what a kill after step 6's
    records and before its checkpoint leaves): metrics.jsonl and TensorBoard hold steps 1-6 once, 4-6
    from the second attempt, and the log says what was dropped; the exit record says where it ended."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    corpus = write_corpus(tmp_path)
    ckpt, metrics, tb, exit_record = tmp_path / "ckpt", tmp_path / "metrics.jsonl", tmp_path / "tb", tmp_path / "exit.json"
    common = [*data_args(corpus, "gpt"), "--train-iters", "6", "--save", str(ckpt), "--save-interval", "3",
              "--metrics-file", str(metrics), "--tensorboard-dir", str(tb), "--eval-interval", "1000", "--seed", "3"]
    pretrain(*common)
    first = read_metrics(metrics)
    assert [r["step"] for r in first] == [1, 2, 3, 4, 5, 6]
    monkeypatch.setenv("MFC_EXIT_RECORD", str(exit_record))
    proc = pretrain(*common, "--load", str(ckpt), "--ckpt-step", "3", "--save", str(tmp_path / "ckpt2"))
    assert "resumed at step 3: dropped 3 metrics lines and" in proc.stderr
    second = read_metrics(metrics)
    assert [r["step"] for r in second] == [1, 2, 3, 4, 5, 6]
    assert second[:3] == first[:3]
    acc = EventAccumulator(str(tb))
    acc.Reload()
    assert [e.step for e in acc.Scalars("lm loss")] == [1, 2, 3, 4, 5, 6]
    assert [e.value for e in acc.Scalars("lm loss")][3:] == pytest.approx([r["loss"] for r in second[3:]])
    assert json.loads(exit_record.read_text()) == {"code": 0, "error": None, "step": 6, "max_steps": 6}


@pytest.mark.slow
def test_the_exit_record_carries_the_trainers_one_line_error(tmp_path, monkeypatch):
    """A refusal before the process group (here: --load of an empty directory): code 2 and the line."""
    record = tmp_path / "exit.json"
    monkeypatch.setenv("MFC_EXIT_RECORD", str(record))
    proc = pretrain("--mock-data", "--train-iters", "2", "--load", str(tmp_path / "nothing"), check=False)
    assert proc.returncode == 2
    got = json.loads(record.read_text())
    assert got["code"] == 2 and got["error"].startswith(f"--load {tmp_path / 'nothing'} does not exist")
    assert got["error"] in proc.stderr.splitlines()[-1]
