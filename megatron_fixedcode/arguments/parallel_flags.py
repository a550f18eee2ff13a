"""Megatron-LM's parallelism flags that act (core_v0.16.1's names, dests and defaults): the layout (TP, PP with
virtual stages, CP, sequence parallel) and recomputation. What they do: ``compat/layout.py``, ``models/``; read
after parsing as the parallel layout and the model config. Precision, FP8, fusions and overlap:
``performance_flags``."""

from __future__ import annotations

import argparse


def add_parallel_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("parallelism")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1, help="tensor-parallel ranks")
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1, help="pipeline stages")
    g.add_argument(
        "--virtual-pipeline-model-parallel-size",
        type=int,
        default=None,
        help="model chunks per pipeline rank (interleaved schedule); this project's name for the value "
        "Megatron-LM derives from the two flags below",
    )
    g.add_argument(
        "--num-layers-per-virtual-pipeline-stage",
        type=int,
        default=None,
        help="interleaved schedule: layers per model chunk (Megatron-LM)",
    )
    g.add_argument(
        "--num-virtual-stages-per-pipeline-rank",
        type=int,
        default=None,
        help="interleaved schedule: model chunks per pipeline rank (Megatron-LM)",
    )
    g.add_argument("--context-parallel-size", type=int, default=1, help="context-parallel ranks")
    g.add_argument("--sequence-parallel", action="store_true", help="shard norms/dropout over the sequence (TP > 1)")
    g.add_argument("--recompute-activations", action="store_true", help="= --recompute-granularity selective")
    g.add_argument(
        "--recompute-granularity",
        choices=["full", "selective"],
        default=None,
        help="activation recompute: full blocks (needs --recompute-method) or the core attention only",
    )
    g.add_argument(
        "--recompute-method",
        choices=["uniform", "block"],
        default=None,
        help="full recompute: uniform (groups of --recompute-num-layers) or block (the first N per stage)",
    )
    g.add_argument(
        "--recompute-num-layers", type=int, default=None, help="full recompute: layers per group / per stage"
    )
