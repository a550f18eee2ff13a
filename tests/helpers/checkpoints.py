"""A tiny model, optimizer and scheduler that has taken one step (Adam's state exists, as in any checkpoint of a
real run), and its weights: for the checkpoint tests that save and load outside a trainer."""

import torch
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from megatron_fixedcode.compat import ParallelLayout
from megatron_fixedcode.models import ModelConfig, build_transformer_config
from megatron_fixedcode.training.forward_backward import forward_backward
from megatron_fixedcode.training.model_chunks import build_model_chunks


def make_trained_parts(single_rank):
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
