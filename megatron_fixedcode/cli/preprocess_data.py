"""Index JSONL / JSONL.gz / Parquet into megatron-core .bin/.idx (Megatron-LM flag names).

Outputs {output_prefix}_{train,valid}_{key}_document.{bin,idx} and {output_prefix}_summary.json;
see docs/data.md.
"""

import argparse
import logging
import sys
import warnings

warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")

from megatron_fixedcode.arguments.tokenizer_flags import add_tokenizer_args
from megatron_fixedcode.arguments.user_errors import ArgumentParser, user_errors
from megatron_fixedcode.data.preprocess.config import PreprocessConfig


def parse_args(argv=None) -> PreprocessConfig:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", required=True, help="files, globs or directories")
    p.add_argument("--output-prefix", required=True)
    add_tokenizer_args(p)
    p.add_argument("--eod-token", default=None, help="end-of-document token, when the tokenizer names none")
    p.add_argument("--json-keys", nargs="+", default=["text"])
    p.add_argument(
        "--id-key", default=None, help="document id field for the split hash (records without one: their text)"
    )
    p.add_argument("--append-eod", action="store_true")
    p.add_argument("--split-sentences", action="store_true")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--valid-fraction", type=float, default=0.001)
    p.add_argument("--split-seed", type=int, default=1234)
    p.add_argument("--min-doc-tokens", type=int, default=2049, help="only counted in the summary")
    p.add_argument("--skip-bad-documents", action="store_true")
    p.add_argument("--log-interval", type=int, default=10000, help="documents between progress lines")
    p.add_argument(
        "--max-document-bytes",
        type=int,
        default=8 << 20,
        help="largest text of one record (UTF-8 bytes per key); larger ones are an error (memory bound)",
    )
    p.add_argument("--chunk-docs", type=int, default=1024)
    p.add_argument("--chunk-bytes", type=int, default=1 << 20)
    return PreprocessConfig(**vars(p.parse_args(argv)))


@user_errors
def main(argv=None) -> int:
    cfg = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    from megatron_fixedcode.data.preprocess.pipeline import preprocess

    from megatron_fixedcode.utils.files import DiskFull

    try:
        summary = preprocess(cfg)
    except DiskFull as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    docs, tokens = summary["documents"], summary["tokens"]
    for split in docs:
        print(f"{split}: {docs[split]} documents, {tokens[split]} tokens")
    print(f"summary: {summary['output_prefix']}_summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
