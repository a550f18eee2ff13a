"""Print every sample of global batch N: shard, document, window start and decoded text.

    python tools/inspect_batch.py --dataset-type document_windows --data-path PREFIX \
        --seq-length 2048 --global-batch-size 128 --seed 1234 --tokenizer-type HuggingFaceTokenizer \
        --tokenizer-model tokenizer.json --step 100
"""

from __future__ import annotations

import argparse
import json

from megatron_fixedcode.arguments.tokenizer_flags import add_tokenizer_args
from megatron_fixedcode.arguments.user_errors import ArgumentParser, user_errors
from megatron_fixedcode.data.config import (
    DATASET_TYPES,
    PAPER2_SAMPLES_PER_SHARD_VISIT,
    DataConfig,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data-path", nargs="+", required=True, help="prefixes or weight/prefix pairs")
    p.add_argument("--dataset-type", choices=DATASET_TYPES, default="gpt")
    p.add_argument("--document-windows", action="store_true", help="same as --dataset-type document_windows")
    p.add_argument("--seq-length", type=int, required=True)
    p.add_argument("--global-batch-size", type=int, required=True)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--step", type=int, required=True, help="0-based optimizer step")
    add_tokenizer_args(p)
    p.add_argument("--split", default="99,1,0")
    p.add_argument("--data-cache-path", default=None)
    p.add_argument("--samples-per-shard-visit", type=int, default=PAPER2_SAMPLES_PER_SHARD_VISIT)
    p.add_argument(
        "--train-samples",
        type=int,
        default=None,
        help="the run's total train samples (GPT path: megatron's shuffle depends on it)",
    )
    p.add_argument("--train-iters", type=int, default=None, help="or the run's train iters")
    p.add_argument("--max-chars", type=int, default=200)
    p.add_argument("--json", action="store_true", help="one JSON object per sample, with token ids")
    return p.parse_args(argv)


@user_errors
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from megatron_fixedcode.data.inspect import format_record, inspect_global_batch
    from megatron_fixedcode.tokenizers import tokenizer_from_args

    tokenizer = tokenizer_from_args(args)
    if tokenizer is None:
        raise ValueError(
            "give --tokenizer-model (GPT2BPETokenizer: --vocab-file and --merge-file) to decode the samples"
        )

    cfg = DataConfig(
        data_path=args.data_path,
        dataset_type="document_windows" if args.document_windows else args.dataset_type,
        seq_length=args.seq_length,
        split=args.split,
        cache_path=args.data_cache_path,
        samples_per_shard_visit=args.samples_per_shard_visit,
    )
    records = inspect_global_batch(
        cfg,
        tokenizer,
        step=args.step,
        global_batch_size=args.global_batch_size,
        seed=args.seed,
        num_train_samples=args.train_samples or (args.train_iters and args.train_iters * args.global_batch_size),
        max_chars=args.max_chars,
    )
    for record in records:
        if args.json:
            print(json.dumps(record.as_dict(with_token_ids=True)))
        else:
            print(format_record(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
