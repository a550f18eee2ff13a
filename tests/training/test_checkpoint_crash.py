"""A crash while saving leaves the previous complete checkpoint as the one that loads."""

from pathlib import Path

import pytest
import torch
from megatron.core import dist_checkpointing
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from megatron_fixedcode import checkpoint
from megatron_fixedcode.compat import ParallelLayout
from megatron_fixedcode.models import ModelConfig, build_transformer_config
from megatron_fixedcode.training.forward_backward import forward_backward
from megatron_fixedcode.training.model_chunks import build_model_chunks


def make(single_rank):
    cfg = ModelConfig(
        num_layers=1,
        hidden_size=32,
        num_attention_heads=2,
        ffn_hidden_size=64,
        seq_length=8,
        vocab_size=256,
        input_embedding="gf2",
        make_vocab_size_divisible_by=8,
    )
    layout = ParallelLayout()
    chunks = build_model_chunks(cfg, build_transformer_config(cfg, layout), layout, single_rank)
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-3, min_lr=1e-4), chunks)
    sched = OptimizerParamScheduler(
        opt,
        init_lr=1e-3,
        max_lr=1e-3,
        min_lr=1e-4,
        lr_warmup_steps=0,
        lr_decay_steps=10,
        lr_decay_style="cosine",
        start_wd=0.0,
        end_wd=0.0,
        wd_incr_steps=10,
        wd_incr_style="constant",
    )
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    batch = {"tokens": ids[:, :-1], "labels": ids[:, 1:], "loss_mask": torch.ones(2, 8)}
    forward_backward(chunks, [batch], num_microbatches=1, seq_length=8, micro_batch_size=2)
    opt.step()  # Adam state exists, as in any checkpoint of a real run
    return chunks, opt, sched


def weights(chunks):
    return {k: v.clone() for k, v in chunks[0].module.state_dict().items() if torch.is_tensor(v)}


def test_crash_during_save_keeps_previous_checkpoint(single_rank, tmp_path, monkeypatch):
    chunks, opt, sched = make(single_rank)
    state = {"step": 1, "tokens": 8, "layout": {"world_size": 1, "tp_size": 1, "pp_size": 1, "dp_size": 1}}
    checkpoint.save_checkpoint(str(tmp_path), 1, chunks, opt, sched, state, keep_last=2)
    saved = weights(chunks)
    for p in chunks[0].module.parameters():
        p.data.add_(1.0)  # training moved on

    real_save = dist_checkpointing.save

    def dies_half_way(state_dict, directory, *args, **kwargs):
        (Path(directory) / "__0_0.distcp").write_bytes(b"partial")
        raise KeyboardInterrupt("killed while writing")

    monkeypatch.setattr(dist_checkpointing, "save", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_checkpoint(str(tmp_path), 2, chunks, opt, sched, dict(state, step=2), keep_last=2)
    monkeypatch.setattr(dist_checkpointing, "save", real_save)

    assert checkpoint.latest_step(tmp_path) == 1
    assert (tmp_path / "iter_0000002").exists()  # the half-written directory is there, but not "latest"
    fresh, opt2, sched2 = make(single_rank)
    loaded = checkpoint.load_checkpoint(str(tmp_path), fresh, opt2, sched2)
    assert loaded["step"] == 1
    for key, value in weights(fresh).items():
        assert torch.equal(value, saved[key]), key
    with pytest.raises(ValueError, match="--ckpt-step 2: no complete checkpoint"):
        checkpoint.load_checkpoint(str(tmp_path), fresh, opt2, sched2, step=2)
