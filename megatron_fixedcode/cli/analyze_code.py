"""Print the properties of a fixed token code (K, rank, weights, collisions, fingerprint)."""

import json
import sys

from megatron_fixedcode.arguments.user_errors import ArgumentParser
from megatron_fixedcode.codes import CODE_DTYPES, CODE_KINDS, PAPER_CODE_SEED, CodeSpec
from megatron_fixedcode.codes.analysis import analyze_code, format_report


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--vocab-size", type=int, required=True)
    p.add_argument("--hidden-size", type=int, required=True)
    p.add_argument("--code", choices=CODE_KINDS, default="binary")
    p.add_argument("--code-seed", type=int, default=PAPER_CODE_SEED)
    p.add_argument("--code-bits", type=int, default=None, help="K (default ceil(log2 V))")
    p.add_argument("--code-offset", type=int, default=0, help="offset b as a K-bit integer mask")
    p.add_argument("--code-min-weight", type=int, default=4)
    p.add_argument("--code-scale", type=float, default=1.0)
    p.add_argument("--code-width", type=int, default=None, help="K' of random/sinusoidal/lowdim")
    p.add_argument("--code-centered", action="store_true", help="binary/gf2 as +-1")
    p.add_argument("--code-base", type=float, default=None, help="sinusoidal frequency base")
    p.add_argument("--dtype", choices=CODE_DTYPES, default="float32", help="activation dtype of the check")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    try:
        spec = CodeSpec.create(
            kind=args.code,
            vocab_size=args.vocab_size,
            hidden_size=args.hidden_size,
            code_bits=args.code_width if args.code_width is not None else args.code_bits,
            seed=args.code_seed,
            min_weight=args.code_min_weight,
            offset=args.code_offset,
            scale=args.code_scale,
            centered=args.code_centered,
            base=args.code_base,
            dtype=args.dtype,
        )
    except ValueError as e:
        p.error(str(e))
    report = analyze_code(spec)
    print(json.dumps(report) if args.json else format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
