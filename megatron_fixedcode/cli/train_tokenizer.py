"""Train a byte-level BPE tokenizer.json on local text files (``<|endoftext|>`` is id 0)."""

import logging
import sys

from megatron_fixedcode.arguments.user_errors import ArgumentParser, user_errors


@user_errors
def main(argv=None) -> int:
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("--input", nargs="+", required=True, help="text files, globs or directories")
    parser.add_argument("--output", required=True, help="directory to write tokenizer.json into")
    parser.add_argument("--vocab-size", type=int, required=True)
    parser.add_argument("--min-frequency", type=int, default=2)
    args = parser.parse_args(argv)
    from megatron_fixedcode.tokenizers import train_bpe_tokenizer

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    path = train_bpe_tokenizer(args.input, args.vocab_size, args.output, args.min_frequency)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
