"""Pretrain a learned-table or fixed-code GPT on megatron-core.

    torchrun --nproc_per_node 2 -m megatron_fixedcode.pretrain --config examples/recipes/tiny_cpu.yaml \
        --data-path PREFIX --tokenizer-model tokenizer.json
"""
from __future__ import annotations

import json
import sys
import warnings

# megatron-core warns at import time that TE/apex are absent; the CPU path is intended.
warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex).*", category=UserWarning)

from megatron_fixedcode.training.arguments import parse_pretrain_args


def main(argv: list[str] | None = None) -> int:
    cfg = parse_pretrain_args(argv)
    if cfg.args.dry_run:
        print(json.dumps(cfg.as_dict(), sort_keys=True))
        return 0
    from megatron_fixedcode.training.loop import run_pretraining

    return run_pretraining(cfg)


if __name__ == "__main__":
    sys.exit(main())
