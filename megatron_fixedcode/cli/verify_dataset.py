"""Verify indexed-dataset shards completely before training on them.

    python tools/verify_dataset.py /data/shards --tokenizer-model tokenizer.json --seq-length 2048

PATHS are dataset prefixes (checked against the summary beside them, where one describes them),
output directories (every *_summary.json in them; without summaries, every .bin/.idx pair),
summary files or manifest.json files. Per shard: .idx header and arrays consistent with the .bin,
document (and token) counts and the .bin/.idx sha256 equal to what indexing recorded; with a
vocabulary (--tokenizer-model, GPT-2's --vocab-file/--merge-file, or --vocab-size), the dtype able to hold it and every token id < V.
Prints tokens, documents and documents with >= seq_length + 1 tokens per shard; exits 2 naming
every bad shard. A long run prints its progress on stderr (--progress-interval). See docs/data.md.
"""

import argparse
import json
import sys
import warnings

from megatron_fixedcode.arguments.tokenizer_flags import add_tokenizer_args
from megatron_fixedcode.arguments.user_errors import ArgumentParser, user_errors

warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")

from megatron_fixedcode.data.verify import verify_paths


@user_errors
def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "paths", nargs="+", help="dataset prefixes, output directories, *_summary.json or manifest.json files"
    )
    add_tokenizer_args(
        p,
        type_default="HuggingFaceTokenizer",
        model_help="gives V (the vocabulary size); without V ids are not checked",
    )
    p.add_argument("--vocab-size", type=int, default=None, help="V without a tokenizer")
    p.add_argument("--seq-length", type=int, default=2048, help="eligible documents have >= seq_length + 1 tokens")
    p.add_argument("--json", action="store_true", help="print the per-shard report as JSON lines")
    p.add_argument(
        "--progress-interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="at most one progress line (shards, bytes, rate, ETA) on stderr this often; the first "
        "after this long, so a short run prints none (default 10; negative: never)",
    )
    args = p.parse_args(argv)
    vocab_size = args.vocab_size
    if vocab_size is None:
        from megatron_fixedcode.tokenizers import tokenizer_from_args

        tokenizer = tokenizer_from_args(args)
        vocab_size = tokenizer.vocab_size if tokenizer is not None else None
    interval = args.progress_interval if args.progress_interval >= 0 else None
    results, errors = verify_paths(args.paths, vocab_size, args.seq_length, progress_interval_s=interval)
    for r in results:
        if args.json:
            print(json.dumps(r))
        else:
            print(
                f"ok {r['prefix']}: {r['tokens']} tokens, {r['documents']} documents, "
                f"{r['eligible_documents']} with >= {args.seq_length + 1} tokens"
            )
    total = {k: sum(r[k] for r in results) for k in ("tokens", "documents", "eligible_documents")}
    print(
        f"{len(results)} shards ok, {len(errors)} bad: {total['tokens']} tokens, {total['documents']} documents, "
        f"{total['eligible_documents']} eligible",
        file=sys.stderr,
    )
    if vocab_size is None:
        print(
            "note: token ids were not checked (no tokenizer or --vocab-size); structure, counts and "
            "recorded hashes were",
            file=sys.stderr,
        )
    unhashed = [r["prefix"] for r in results if r["content"] is None]
    if unhashed:
        print(
            f"note: {len(unhashed)} of {len(results)} shards verified without a recorded .bin sha256 (indexed "
            f"before it was recorded, or no summary beside them), so a change of their tokens cannot be seen: "
            f"{', '.join(unhashed[:3])}"
            f"{' ...' if len(unhashed) > 3 else ''}; re-index them to record it",
            file=sys.stderr,
        )
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    return 2 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
