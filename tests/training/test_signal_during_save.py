"""A SIGTERM that arrives while a checkpoint is being saved ends the run at that
checkpoint; it used to be read only before the save, so it cost one more step and one more save
inside the grace window."""

import os
import signal
import types

import pytest
import torch
import torch.distributed as dist

from megatron_fixedcode.arguments.downstream_flags import DownstreamConfig
from megatron_fixedcode.arguments.observe_flags import WatchConfig
from megatron_fixedcode.arguments.logging_flags import LoggingConfig
from megatron_fixedcode.checkpoint.checkpointer import Checkpointer
from megatron_fixedcode.training import loop


class _FakeTrainer:
    """Just what :func:`loop.train` touches on a rank other than 0; its save is where the signal
    comes."""

    def __init__(self, save_dir: str, signal_at_save: int):
        schedule = types.SimpleNamespace(skip_train=False, eval_interval=None, seq_length=32, train_tokens=None)
        checkpoint = types.SimpleNamespace(
            save=save_dir,
            save_interval=2,
            exit_duration_in_mins=None,
            exit_interval=None,
            exit_signal_handler=True,
            exit_signal="SIGTERM",
            async_save=False,
            hf_export_interval=None,
            non_persistent_save_interval=None,
            keep_last=None,
            retain_interval=None,
        )
        self.cfg = types.SimpleNamespace(
            schedule=schedule,
            checkpoint=checkpoint,
            as_dict=lambda: {},
            watch=WatchConfig(),
            downstream=DownstreamConfig(),
            performance=types.SimpleNamespace(precision="fp32"),
            logging=LoggingConfig(log_interval=1, tensorboard_dir=None, metrics_file=None, wandb_project=None),
            health=types.SimpleNamespace(manual_gc=False, manual_gc_interval=0, empty_unused_memory_level=0),
        )
        self.model_cfg = types.SimpleNamespace(num_layers=2, hidden_size=64)
        self.iterations_to_skip = ()
        self.ranks = {"rank": 1, "world_size": 1}  # not rank 0: no start-up report
        self.report, self.device, self.valid_ds = {}, torch.device("cpu"), None
        self.step, self.max_steps, self.tokens = 0, 10, 0
        self.global_batch, self.tf32, self.wandb_run_id = 4, False, None
        self.identity = {"code_fingerprint": "0" * 16}
        self.saves: list[int] = []
        self.local_checkpoints = None
        self.signal_at_save = signal_at_save

    def train_step(self) -> dict:
        self.step += 1
        return {"step": self.step}

    def write_checkpoint(self) -> None:  # the Checkpointer's write, in place of a real one
        self.saves.append(self.step)
        if self.step == self.signal_at_save:  # Slurm's signal, while the checkpoint is written
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.fixture
def world_of_one(tmp_path):
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield


def test_sigterm_during_a_save_ends_the_run_at_that_checkpoint(tmp_path, monkeypatch, world_of_one):
    monkeypatch.setattr(
        loop,
        "MetricsSink",
        lambda *a, **k: types.SimpleNamespace(record=lambda r: None, close=lambda: None, metrics_file=None),
    )
    monkeypatch.setattr(loop, "model_flops_per_token", lambda *a: 1.0)
    monkeypatch.setattr(Checkpointer, "_write", lambda self, *a, **k: self.trainer.write_checkpoint())
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    trainer = _FakeTrainer(str(tmp_path / "ckpt"), signal_at_save=4)
    try:
        assert loop.train(trainer) == 0
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    assert trainer.step == 4, "a step ran after the save during which the signal came"
    assert trainer.saves == [2, 4], "a second save ran after the save during which the signal came"
