"""torchrun worker for tests/training/test_sft_per_token_loss.py: one global batch of SFT-like samples
(response-only loss masks of very different lengths) on 2 data-parallel ranks, split into
microbatches three ways, through megatron's schedule, DDP and finalize_model_grads with the loss
settings the trainer uses for each ``--dataset-type`` given. Writes, per split, the largest relative
difference of the gradient from the exact gradient of the mean NLL over all loss positions of the
global batch (computed on each rank by a plain forward/backward of the same weights)."""

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist

from megatron_fixedcode.compat import ParallelLayout, destroy_distributed, initialize_distributed
from megatron_fixedcode.models import ModelConfig, build_transformer_config
from megatron_fixedcode.training.forward_backward import forward_backward, loss_config_fields
from megatron_fixedcode.training.model_chunks import build_model_chunks

SEQ, VOCAB, GLOBAL = 16, 256, 8
SPLITS = ((1, 4), (2, 2), (4, 1))  # (microbatches, micro batch size) of each rank's 4 samples


def global_batch() -> dict:
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, VOCAB, (GLOBAL, SEQ + 1), generator=g)
    mask = torch.zeros(GLOBAL, SEQ)
    for i, n in enumerate(
        (1, 15, 2, 9, 16, 3, 1, 2)
    ):  # rank 0: 27 tokens, rank 1: 22  # response lengths: prompt first, then the response
        mask[i, SEQ - n :] = 1
    return {"tokens": seq[:, :-1], "labels": seq[:, 1:].contiguous(), "loss_mask": mask}


def build(config_fields: dict, layout, pg, wrap_ddp: bool):
    torch.manual_seed(1234)
    cfg = ModelConfig(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=2,
        ffn_hidden_size=64,
        seq_length=SEQ,
        vocab_size=VOCAB,
        input_embedding="binary",
        make_vocab_size_divisible_by=8,
    )
    return build_model_chunks(
        cfg, build_transformer_config(cfg, layout, **config_fields), layout, pg, wrap_ddp=wrap_ddp
    )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--dataset-types", nargs="+", default=["sft"])
    args = p.parse_args()
    layout = ParallelLayout()
    pg = initialize_distributed(layout, seed=1234)
    rank, world = dist.get_rank(), dist.get_world_size()
    batch = global_batch()

    # the reference: d/dw of sum(nll * mask) / sum(mask) over the whole global batch, one process
    ref_model = build({}, layout, pg, wrap_ddp=False)[0]
    pos = torch.arange(SEQ).expand(GLOBAL, -1)
    nll = ref_model(batch["tokens"], pos, None, labels=batch["labels"]).float()
    ((nll * batch["loss_mask"]).sum() / batch["loss_mask"].sum()).backward()
    reference = {n: p.grad.clone() for n, p in ref_model.named_parameters()}

    per_rank = GLOBAL // world
    mine = {k: v[rank * per_rank : (rank + 1) * per_rank] for k, v in batch.items()}
    result = {}
    for dataset_type in args.dataset_types:
        chunks = build(loss_config_fields(dataset_type), layout, pg, wrap_ddp=True)
        result[dataset_type] = {}
        for num_mb, mbs in SPLITS:
            chunks[0].zero_grad_buffer()
            micro = [{k: v[i * mbs : (i + 1) * mbs] for k, v in mine.items()} for i in range(num_mb)]
            forward_backward(chunks, micro, num_microbatches=num_mb, seq_length=SEQ, micro_batch_size=mbs)
            worst = 0.0
            for name, param in chunks[0].module.named_parameters():
                ref = reference[name]
                worst = max(worst, ((param.main_grad - ref).norm() / ref.norm().clamp_min(1e-30)).item())
            result[dataset_type][f"{num_mb}x{mbs}"] = worst
    gathered = [None] * world
    dist.all_gather_object(gathered, result)
    if rank == 0:
        Path(args.out).write_text(json.dumps(gathered))
    destroy_distributed()


if __name__ == "__main__":
    main()
