"""torchrun worker for the parallel-parity tests (see tests/models/test_parallel_parity.py).

mode ``run``: build learned/binary/gf2/gpt2 models under --layout, optionally load shared weights,
run one forward/backward of a fixed batch through megatron's schedule and DDP, then save the
gradients as a distributed checkpoint (gradient copied into each parameter) plus the loss.
mode ``compare``: on one rank, load two gradient checkpoints (any layout) and report the
largest relative difference per variant. Megatron's resharding does the gathering.
"""

import megatron_fixedcode  # noqa: F401  (first: its megatron-core compatibility patches, compat/)

# isort: split
import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing

from megatron_fixedcode.compat import ParallelLayout, destroy_distributed, initialize_distributed
from megatron_fixedcode.compat.collectives import count_collectives, num_collective_calls
from megatron_fixedcode.models import ModelConfig, build_transformer_config
from megatron_fixedcode.training.forward_backward import forward_backward
from megatron_fixedcode.training.model_chunks import build_model_chunks

VARIANTS = ("learned", "binary", "gf2", "gpt2")
# Megatron-LM's default GPT-2 block: the learned table tied to the output layer (across pipeline
# stages: finalize_model_grads sums the two copies' gradients), learned positions, linear biases
GPT2_BLOCK = dict(
    input_embedding="learned",
    block="gpt_gelu",
    add_bias_linear=True,
    position_embedding_type="learned_absolute",
    share_embeddings_and_output_weights=True,
)
EXTRA_VARIANTS = {  # the research interfaces (tests/models/test_codes_parity.py): name -> ModelConfig fields
    "binary_centered_normmatch": dict(input_embedding="binary", code_centered=True, code_norm_match=True),
    "random": dict(input_embedding="random", code_width=24),
    "sinusoidal": dict(input_embedding="sinusoidal"),
    "lowdim": dict(input_embedding="lowdim"),
}
LAYOUTS = {
    "single": ParallelLayout(),
    "tp2sp": ParallelLayout(tensor_model_parallel_size=2, sequence_parallel=True),
    "pp2": ParallelLayout(pipeline_model_parallel_size=2),
}
SEQ, MBS, NUM_MB, VOCAB = 32, 2, 2, 1000


def model_config(variant: str) -> ModelConfig:
    return ModelConfig(
        num_layers=4,
        hidden_size=64,
        num_attention_heads=4,
        num_query_groups=2,
        ffn_hidden_size=128,
        seq_length=SEQ,
        vocab_size=VOCAB,
        make_vocab_size_divisible_by=64,
        **{"gpt2": GPT2_BLOCK, **EXTRA_VARIANTS}.get(variant, {"input_embedding": variant}),
    )


def microbatches():
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(NUM_MB):
        seq = torch.randint(0, VOCAB, (MBS, SEQ + 1), generator=g)
        out.append({"tokens": seq[:, :-1], "labels": seq[:, 1:].contiguous(), "loss_mask": torch.ones(MBS, SEQ)})
    return out


def sharded(chunks):
    sd = {}
    for chunk in chunks:
        sd.update(chunk.module.sharded_state_dict() if hasattr(chunk, "module") else chunk.sharded_state_dict())
    return sd


def save(state_dict, path: Path):
    path.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(state_dict, str(path))


def embedding_collectives(chunks, batch) -> int:
    """Collective calls issued by the input layer alone, forward and backward."""
    model = chunks[0].module
    if not model.pre_process:
        return -1
    with count_collectives() as counts:
        tokens = batch["tokens"]
        x = model.embedding(tokens, torch.arange(tokens.shape[1]).expand_as(tokens))
        if x.requires_grad:
            x.sum().backward()
    for p in model.parameters():  # drop the probe's gradients
        p.grad = None
    chunks[0].zero_grad_buffer()
    return num_collective_calls(counts)


def run(args, layout):
    pg = initialize_distributed(layout, seed=1234)
    results = {}
    for variant in args.variants:
        torch.manual_seed(1234)
        cfg = model_config(variant)
        config = build_transformer_config(cfg, layout)
        chunks = build_model_chunks(cfg, config, layout, pg)
        weights = Path(args.workdir) / f"weights_{variant}"
        if args.save_weights:
            save(sharded(chunks), weights)
        else:
            loaded = dist_checkpointing.load(sharded(chunks), str(weights))
            for chunk in chunks:
                chunk.module.load_state_dict(loaded, strict=False)
        n_coll = embedding_collectives(chunks, microbatches()[0])
        out = forward_backward(chunks, microbatches(), num_microbatches=NUM_MB, seq_length=SEQ, micro_batch_size=MBS)
        for chunk in chunks:
            for p in chunk.module.parameters():
                p.data.copy_(p.main_grad)
        grads_dir = Path(args.workdir) / f"grads_{args.layout}_{variant}"
        save(sharded(chunks), grads_dir)
        results[variant] = {"loss": out[0] / out[1] if out else None, "embedding_collectives": n_coll}
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, results)
    if dist.get_rank() == 0:
        Path(args.workdir, f"result_{args.layout}.json").write_text(json.dumps(gathered))
    destroy_distributed()


def load_other_code_error(args, layout, pg) -> str:
    """Load the gf2 weights checkpoint into a binary-code model: must be refused."""
    cfg = model_config("binary")
    chunks = build_model_chunks(cfg, build_transformer_config(cfg, layout), layout, pg, wrap_ddp=False)
    sd = dist_checkpointing.load(sharded(chunks), str(Path(args.workdir) / "weights_gf2"))
    try:
        chunks[0].load_state_dict(sd)
    except ValueError as e:
        return str(e)
    return ""


def compare(args):
    layout = LAYOUTS["single"]
    pg = initialize_distributed(layout, seed=1234)
    report = {}
    for variant in args.variants:
        cfg = model_config(variant)
        config = build_transformer_config(cfg, layout)
        loaded = []
        for layout_name in (args.reference, args.layout):
            chunks = build_model_chunks(cfg, config, layout, pg, wrap_ddp=False)
            sd = dist_checkpointing.load(sharded(chunks), str(Path(args.workdir) / f"grads_{layout_name}_{variant}"))
            chunks[0].load_state_dict(sd)
            loaded.append(dict(chunks[0].named_parameters()))
        ref, other = loaded
        worst = {}
        for name, g_ref in ref.items():
            diff = (other[name] - g_ref).abs().max().item()
            worst[name] = diff / max(g_ref.abs().max().item(), 1e-30)
        report[variant] = {
            "max_rel_diff": max(worst.values()),
            "worst_param": max(worst, key=worst.get),
            "num_params": len(worst),
            "min_grad_scale": min(g.abs().max().item() for g in ref.values()),
        }
    if "gf2" in args.variants:
        report["code_mismatch_error"] = load_other_code_error(args, layout, pg)
    Path(args.workdir, f"compare_{args.layout}.json").write_text(json.dumps(report))
    destroy_distributed()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["run", "compare"])
    p.add_argument("--layout", choices=sorted(LAYOUTS), required=True)
    p.add_argument("--reference", default="single")
    p.add_argument("--workdir", required=True)
    p.add_argument("--save-weights", action="store_true")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=[*VARIANTS, *EXTRA_VARIANTS])
    a = p.parse_args()
    run(a, LAYOUTS[a.layout]) if a.mode == "run" else compare(a)
