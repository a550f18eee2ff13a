"""A training rank with faults made on purpose, for the run-watch tests (never imported by the package):
``python -m torch.distributed.run ... -m tests.helpers.slowed_rank [--slow-rank R] [--diverge-at N] FLAGS``
runs ``megatron_fixedcode.pretrain`` with rank R's model forward slowed by 0.1 s (a slow GPU) and, with
``--diverge-at N``, rank 1's weights nudged after step N (replicas that drifted apart)."""

import os
import sys
import time

import torch

from megatron_fixedcode import pretrain
from megatron_fixedcode.training.trainer import Trainer


def _take(argv: list[str], flag: str) -> int | None:
    if flag not in argv:
        return None
    i = argv.index(flag)
    value = int(argv[i + 1])
    del argv[i : i + 2]
    return value


def main() -> int:
    argv = sys.argv[1:]
    slow_rank, diverge_at = _take(argv, "--slow-rank"), _take(argv, "--diverge-at")
    rank = int(os.environ.get("RANK", "0"))
    build, step = Trainer.__init__, Trainer.train_step

    def slowed_build(self, *args, **kwargs):
        build(self, *args, **kwargs)
        self.chunks[0].register_forward_pre_hook(lambda module, inputs: time.sleep(0.1))

    def drifting_step(self):
        record = step(self)
        if self.step == diverge_at:
            with torch.no_grad():
                next(self.chunks[0].parameters()).add_(1e-3)
        return record

    if rank == slow_rank:
        Trainer.__init__ = slowed_build
    if rank == 1 and diverge_at is not None:
        Trainer.train_step = drifting_step
    return pretrain.main(argv)


if __name__ == "__main__":
    sys.exit(main())
