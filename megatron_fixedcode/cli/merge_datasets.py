"""Merge megatron-core .bin/.idx shards into one dataset (like Megatron-LM's merge_datasets.py)."""

import logging
import sys
import warnings

from megatron_fixedcode.arguments.user_errors import ArgumentParser, user_errors

warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")


@user_errors
def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--input", nargs="+", required=True, help="directories or dataset prefixes, merged in order")
    p.add_argument("--output-prefix", required=True)
    p.add_argument("--pattern", default="*", help="glob for prefixes inside --input directories")
    args = p.parse_args(argv)
    from megatron_fixedcode.data.preprocess import merge_datasets

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    result = merge_datasets(args.input, args.output_prefix, args.pattern)
    print(f"{result['documents']} documents, {result['tokens']} tokens -> {result['output_prefix']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
