"""Pretrain a learned-table or fixed-code GPT on megatron-core.

    torchrun --nproc_per_node 2 -m megatron_fixedcode.pretrain --config examples/recipes/tiny_cpu.yaml \
        --data-path PREFIX --tokenizer-model tokenizer.json
"""

from __future__ import annotations

import json
import os
import sys
import warnings

from megatron_fixedcode.utils.exit_signals import exit_at_once_until_training

# First thing, before the imports below take seconds: under the Slurm launchers the ranks start with
# TERM and USR1 ignored (examples/slurm_node.sh), so a signal would otherwise be lost until the loop.
if __name__ == "__main__" and "--exit-signal-handler" in sys.argv and "--dry-run" not in sys.argv:
    exit_at_once_until_training()

# megatron-core warns at import time that TE/apex are absent; the CPU path is intended.
warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex).*", category=UserWarning)

from megatron_fixedcode.arguments.parse import parse_pretrain_args


def main(argv: list[str] | None = None) -> int:
    cfg = parse_pretrain_args(argv)
    if cfg.dry_run:
        from megatron_fixedcode.arguments.memory_estimate import print_plan

        print(json.dumps(cfg.as_dict(), sort_keys=True))  # stdout: the resolved config, which launchers read
        # stderr: for WORLD_SIZE GPUs (1 when unset; the Slurm launchers set it for their dry runs)
        print_plan(cfg, int(os.environ.get("WORLD_SIZE", "1")))
        return 0
    if cfg.checkpoint.exit_signal_handler:  # also when called as a function (a recipe may set the flag)
        exit_at_once_until_training()
    from megatron_fixedcode.training.loop import run_pretraining

    return run_pretraining(cfg)


if __name__ == "__main__":
    sys.exit(main())
