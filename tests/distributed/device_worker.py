"""Worker for tests/training/test_device_contract.py: build the real Trainer from pretrain flags, run one
optimizer step, and report where every parameter, buffer, model input and collective tensor lives.

    python tests/distributed/device_worker.py OUT.json -- <pretrain flags>
"""

import json
import sys

import torch

from megatron_fixedcode.compat import destroy_distributed
from megatron_fixedcode.compat.collectives import count_collectives, tensor_devices
from megatron_fixedcode.arguments.parse import parse_pretrain_args
from megatron_fixedcode.training.trainer import Trainer


def main():
    out, argv = sys.argv[1], sys.argv[sys.argv.index("--") + 1 :]
    trainer = Trainer(parse_pretrain_args(argv))
    inputs = []
    hooks = [
        chunk.register_forward_pre_hook(
            lambda m, args: inputs.extend(str(a.device) for a in args if torch.is_tensor(a))
        )
        for chunk in trainer.chunks
    ]
    with count_collectives() as counts:
        record = trainer.train_step()
    for hook in hooks:
        hook.remove()
    tensors = {
        f"{i}.{name}": t
        for i, chunk in enumerate(trainer.chunks)
        for name, t in [*chunk.named_parameters(), *chunk.named_buffers()]
    }
    report = {
        "trainer_device": str(trainer.device),
        "loss": record["loss"],
        "tensor_devices": sorted({str(t.device) for t in tensors.values()}),
        "num_tensors": len(tensors),
        "input_devices": sorted(set(inputs)),
        "collective_devices": tensor_devices(counts),
    }
    with open(out, "w") as f:
        json.dump(report, f)
    destroy_distributed()


if __name__ == "__main__":
    main()
