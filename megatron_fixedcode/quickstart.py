"""A few optimizer steps of tiny learned / binary / gf2 models on a synthetic token stream.

The stand-in main job until the full trainer exists: it builds each model through megatron-core
(DDP, schedules, optimizer), prints the parameter report and the loss per step. The stream is
learnable (arithmetic progressions of ids), so falling loss shows the models train.

    torchrun --nproc_per_node 2 -m megatron_fixedcode.quickstart --steps 30
"""
from __future__ import annotations

import argparse
import logging
import time

import torch
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

from megatron_fixedcode.compat import ParallelLayout, destroy_distributed, initialize_distributed, parallel_ranks
from megatron_fixedcode.models import ModelConfig, build_transformer_config, format_parameter_report, parameter_report
from megatron_fixedcode.training.forward_backward import forward_backward
from megatron_fixedcode.training.model_chunks import build_model_chunks


def progression_batch(step: int, rank: int, batch: int, seq_len: int, vocab_size: int) -> dict:
    """Sequences ``a, a+d, a+2d, ...`` (mod V) with per-sequence a and d: next token is predictable."""
    g = torch.Generator().manual_seed(1_000_003 * step + rank)
    start = torch.randint(0, vocab_size, (batch, 1), generator=g)
    stride = torch.randint(1, 8, (batch, 1), generator=g)
    seq = (start + stride * torch.arange(seq_len + 1)) % vocab_size
    return {"tokens": seq[:, :-1], "labels": seq[:, 1:].contiguous(), "loss_mask": torch.ones(batch, seq_len)}


def train_variant(variant: str, args, layout: ParallelLayout, pg) -> list[float]:
    cfg = ModelConfig(num_layers=2, hidden_size=128, num_attention_heads=4, ffn_hidden_size=256,
                      seq_length=args.seq_length, vocab_size=args.vocab_size, input_embedding=variant)
    torch.manual_seed(args.seed)
    config = build_transformer_config(cfg, layout)
    chunks = build_model_chunks(cfg, config, layout, pg)
    ranks = parallel_ranks()
    if ranks["rank"] == 0:
        print(format_parameter_report(parameter_report(cfg, [c.module for c in chunks], pg)), flush=True)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=args.lr, weight_decay=0.01, adam_beta2=0.95, clip_grad=1.0), chunks
    )
    losses = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        for chunk in chunks:
            chunk.zero_grad_buffer()
        optimizer.zero_grad()
        batch = progression_batch(step, ranks["dp_rank"], args.micro_batch_size, args.seq_length, args.vocab_size)
        total, count = forward_backward(chunks, [batch], num_microbatches=1, seq_length=args.seq_length,
                                        micro_batch_size=args.micro_batch_size)
        _, grad_norm, _ = optimizer.step()
        losses.append(total / count)
        if ranks["rank"] == 0 and (step % 5 == 0 or step == args.steps - 1):
            tokens_per_s = args.micro_batch_size * args.seq_length * ranks["dp_size"] / (time.perf_counter() - t0)
            print(f"[{variant:>7}] step {step:3d}  loss {total / count:.4f}  grad norm {grad_norm:.3f}  "
                  f"{tokens_per_s:,.0f} tokens/s", flush=True)
    return losses


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--seq-length", type=int, default=64)
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--input-embedding", nargs="+", default=["learned", "binary", "gf2"])
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    layout = ParallelLayout()
    pg = initialize_distributed(layout, seed=args.seed)
    results = {v: train_variant(v, args, layout, pg) for v in args.input_embedding}
    if parallel_ranks()["rank"] == 0:
        print("\nfirst → last loss per input interface:")
        for variant, losses in results.items():
            print(f"  {variant:>7}: {losses[0]:.4f} → {losses[-1]:.4f}")
    destroy_distributed()


if __name__ == "__main__":
    main()
