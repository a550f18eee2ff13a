"""torchrun worker for tests/training/test_device_contract.py: build a model under --layout and save each
rank's initial weights keyed by *global* layer number, plus the TP partition of each tensor.

    torchrun --nproc_per_node N tests/distributed/init_worker.py --layout {single,pp2,tp2,vpp2} --out DIR
"""

import argparse
import re
from pathlib import Path

import torch
import torch.distributed as dist

from megatron_fixedcode.compat import ParallelLayout, destroy_distributed, initialize_distributed, parallel_ranks
from megatron_fixedcode.compat.rng import seed_streams
from megatron_fixedcode.models import ModelConfig, build_transformer_config
from megatron_fixedcode.training.model_chunks import build_model_chunks

LAYOUTS = {
    "single": ParallelLayout(),
    "pp2": ParallelLayout(pipeline_model_parallel_size=2),
    "vpp2": ParallelLayout(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2),
    "tp2": ParallelLayout(tensor_model_parallel_size=2),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layout", choices=sorted(LAYOUTS), required=True)
    p.add_argument("--variant", default="binary")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    layout = LAYOUTS[a.layout]
    pg = initialize_distributed(layout, seed=1234)
    cfg = ModelConfig(
        num_layers=4,
        hidden_size=64,
        num_attention_heads=4,
        num_query_groups=2,
        ffn_hidden_size=128,
        seq_length=16,
        vocab_size=1000,
        make_vocab_size_divisible_by=64,
        input_embedding=a.variant,
    )
    seed_streams(1234)  # as the trainer does before building
    chunks = build_model_chunks(cfg, build_transformer_config(cfg, layout), layout, pg, wrap_ddp=False)
    weights, partition = {}, {}
    for chunk in chunks:
        for name, param in chunk.named_parameters():
            if name.startswith("decoder.layers."):
                local = int(name.split(".")[2])
                number = chunk.decoder.layers[local].layer_number  # global, 1-based
                name = re.sub(r"^decoder\.layers\.\d+\.", f"layer{number}.", name)
            weights[name] = param.detach().clone()
            if getattr(param, "tensor_model_parallel", False):
                partition[name] = (param.partition_dim, getattr(param, "partition_stride", 1))
    r = parallel_ranks()
    torch.save({"weights": weights, "partition": partition, "ranks": r}, Path(a.out) / f"{a.layout}_rank{r['rank']}.pt")
    dist.barrier()
    destroy_distributed()


if __name__ == "__main__":
    main()
