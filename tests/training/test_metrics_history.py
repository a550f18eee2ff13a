"""One record per step: a run that resumes from a checkpoint (or starts again after a crash before
its first one) drops what the earlier attempt recorded after that step, from metrics.jsonl and from
TensorBoard's event files, and says so in one line; the exit record a launcher reads."""

from __future__ import annotations

import json
import logging

import pytest

from megatron_fixedcode.training.metrics_history import MetricsFile, drop_jsonl_after, drop_tensorboard_after
from tests.helpers.disk import small_tmpfs
from tests.helpers.pretrain import data_args, pretrain, read_metrics, write_corpus


def test_jsonl_keeps_the_steps_up_to_the_checkpoint_and_drops_a_torn_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": s / 10}) + "\n" for s in range(1, 6)) + '{"step": 6, "lo')
    assert drop_jsonl_after(path, 3) == 3
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]
    assert drop_jsonl_after(path, 3) == 0 and drop_jsonl_after(tmp_path / "absent.jsonl", 3) == 0


def test_a_full_disk_leaves_whole_lines_one_warning_and_names_the_missing_steps(tmp_path, caplog):
    with small_tmpfs(tmp_path / "disk", "8k") as disk:
        filler = disk / "filler"
        filler.write_bytes(b"x" * 4096)
        metrics = MetricsFile(disk / "metrics.jsonl")
        record = {"step": 0, "loss": 1.0, "pad": "p" * 150}
        with caplog.at_level(logging.WARNING):
            for step in range(1, 41):  # 40 x ~190 bytes: the disk fills after ~21 lines
                metrics.write({**record, "step": step})
            full = [json.loads(line)["step"] for line in (disk / "metrics.jsonl").read_text().splitlines()]
            filler.unlink()
            metrics.write({**record, "step": 41})
        metrics.close()
        steps = [json.loads(line)["step"] for line in (disk / "metrics.jsonl").read_text().splitlines()]
        assert full == list(range(1, len(full) + 1)) and 10 < len(full) < 40
        assert steps == full + [41]
        warnings = [r.getMessage() for r in caplog.records]
        assert len(warnings) == 2, warnings
        assert warnings[0].startswith(f"cannot write {disk / 'metrics.jsonl'} (No space left on device; ")
        assert f"the steps from {len(full) + 1} on are not recorded" in warnings[0]
        assert (
            warnings[1]
            == f"{disk / 'metrics.jsonl'} written again from step 41: steps {len(full) + 1}-40 are missing there"
        )
        # a resume on that full disk cuts the dropped lines off in place (a rewrite would need room for a copy)
        with open(filler, "wb", buffering=0) as f, pytest.raises(OSError):
            while True:
                f.write(b"x" * 512)
        assert drop_jsonl_after(disk / "metrics.jsonl", 5) == len(steps) - 5
        assert [json.loads(line)["step"] for line in (disk / "metrics.jsonl").read_text().splitlines()] == [
            1,
            2,
            3,
            4,
            5,
        ]


def test_the_metrics_sink_on_a_full_disk_says_so_once_and_goes_on(tmp_path, caplog):
    pytest.importorskip("tensorboard")
    from megatron_fixedcode.arguments.logging_flags import LoggingConfig
    from megatron_fixedcode.training.metrics import MetricsSink

    with small_tmpfs(tmp_path / "disk", "8k") as disk:
        cfg = LoggingConfig(
            log_interval=1000,
            tensorboard_dir=str(disk / "tb"),
            metrics_file=str(tmp_path / "m.jsonl"),
            wandb_project=None,
        )
        sink = MetricsSink(cfg, enabled=True, max_steps=400, flops_per_token=1.0, num_gpus=1, run_config={})
        with caplog.at_level(logging.WARNING):
            for step in range(1, 401):  # ~50 bytes of events per step: the 8 KiB fill long before step 400
                sink.record(
                    {
                        "step": step,
                        "loss": 1.0,
                        "lr": 1e-3,
                        "grad_norm": 1.0,
                        "step_time_s": 0.1,
                        "tokens": step,
                        "step_tokens": 1,
                    }
                )
            sink.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(f"TensorBoard logging to {disk / 'tb'} stops at step "), (
        warnings
    )
    assert warnings[0].endswith("(No space left on device); training goes on, metrics.jsonl has every step")
    assert [json.loads(line)["step"] for line in (tmp_path / "m.jsonl").read_text().splitlines()] == list(range(1, 401))


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
        (6, 16.0),
        (7, 17.0),
        (8, 18.0),
    ]
    assert [e.step for e in acc.Scalars("lm loss vs samples")] == [4 * s for s in range(1, 9)]


@pytest.mark.slow
def test_a_resumed_run_records_each_step_once(tmp_path, monkeypatch):
    """Steps 1-6 with checkpoints at 3 and 6, then a resume from step 3 (what a kill after step 6's
    records and before its checkpoint leaves): metrics.jsonl and TensorBoard hold steps 1-6 once, 4-6
    from the second attempt, and the log says what was dropped; the exit record says where it ended."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    corpus = write_corpus(tmp_path)
    ckpt, metrics, tb, exit_record = (
        tmp_path / "ckpt",
        tmp_path / "metrics.jsonl",
        tmp_path / "tb",
        tmp_path / "exit.json",
    )
    common = [
        *data_args(corpus, "gpt"),
        "--train-iters",
        "6",
        "--save",
        str(ckpt),
        "--save-interval",
        "3",
        "--metrics-file",
        str(metrics),
        "--tensorboard-dir",
        str(tb),
        "--eval-interval",
        "1000",
        "--seed",
        "3",
    ]
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
    record = json.loads(exit_record.read_text())
    assert 0 < record.pop("goodput") <= 1  # one attempt: the share of its wall-clock time spent in steps
    assert record == {
        "code": 0,
        "error": None,
        "step": 6,
        "max_steps": 6,
        "stopped_by": None,
        "rerun_nodes": [],
        "restarts": [],
    }
    pretrain(
        *common,
        "--load",
        str(ckpt),
        "--ckpt-step",
        "3",
        "--save",
        str(tmp_path / "ckpt3"),
        "--exit-interval",
        "4",
        "--metrics-file",
        str(tmp_path / "m3.jsonl"),
        "--tensorboard-dir",
        str(tmp_path / "tb3"),
    )
    record = json.loads(exit_record.read_text())
    assert 0 < record.pop("goodput") <= 1  # one attempt: the share of its wall-clock time spent in steps
    assert record == {
        "code": 0,
        "error": None,
        "step": 4,
        "max_steps": 6,
        "stopped_by": "--exit-interval",
        "rerun_nodes": [],
        "restarts": [],
    }


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
