"""The checks a launcher runs on the batch shell before torchrun starts: what the trainer would
refuse in its first seconds, refused in one line with exit code 2 and no rank started.

    WORLD_SIZE=16 python -m megatron_fixedcode.training.preflight TRAINER_FLAGS...

* the run plan (:func:`~megatron_fixedcode.training.run_plan.plan_run`, less its CUDA and TE checks):
  the tokenizer loads, the layout fits the world size, and a checkpoint directory to resume from holds this model
  (shape, input interface, tokenizer, data stream);
* every prefix of the train and valid blends is an index whose ``.bin`` matches it, whose token
  dtype holds the vocabulary and whose indexing summary (if any) names this tokenizer (data/validate.py), and the first tokens of each shard (at most
  ``SAMPLE_TOKENS``; a full scan is the data verification tool's job) lie inside the vocabulary.
"""

from __future__ import annotations

import sys

import numpy

SAMPLE_TOKENS = 1 << 20  # per shard: 2-4 MB read, fractions of a second even for hundreds of shards


def check_token_sample(prefix: str, dtype: str, vocab_size: int, field: str) -> None:
    from megatron_fixedcode.data.validate import check_token_ids

    tokens = numpy.memmap(prefix + ".bin", dtype=numpy.dtype(dtype), mode="r")
    check_token_ids(
        numpy.asarray(tokens[:SAMPLE_TOKENS]),
        vocab_size,
        lambda: f"{field} {prefix} (its first {min(SAMPLE_TOKENS, tokens.size)} tokens)",
    )


def preflight(argv: list[str]) -> None:
    """Raise ``ValueError`` (or exit 2 from the parser) on the first problem."""
    from megatron_fixedcode.data.validate import check_recorded_tokenizer, check_shards
    from megatron_fixedcode.arguments.parse import parse_pretrain_args
    from megatron_fixedcode.training.run_plan import plan_run

    cfg = parse_pretrain_args(argv)
    plan = plan_run(cfg, check_machine=False)  # the batch shell may see no GPU: the ranks check that
    data = cfg.data
    if data.mock or data.dataset_type == "sft":
        return
    vocab = getattr(plan.tokenizer, "vocab_size", None)
    for field, blend in (("data_path", data.blend), ("valid_data_path", data.valid_blend)):
        prefixes = blend[0] if blend is not None else []
        shapes = check_shards(prefixes, vocab, field)
        check_recorded_tokenizer(prefixes, plan.tokenizer, field)
        if vocab is not None:
            for prefix, shape in zip(prefixes, shapes):
                check_token_sample(prefix, shape["dtype"], int(vocab), field)


def main(argv: list[str] | None = None) -> int:
    import logging
    import warnings

    warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex).*", category=UserWarning)  # as pretrain.py
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        preflight(sys.argv[1:] if argv is None else argv)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
