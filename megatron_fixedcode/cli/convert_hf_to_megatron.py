"""Convert a Hugging Face Llama directory (ours or e.g. SmolLM2) to a megatron-fixedcode checkpoint.

    python tools/convert_hf_to_megatron.py --hf-dir HF_DIR --save CKPT_DIR
    torchrun --nproc_per_node 2 -m megatron_fixedcode.pretrain ... --load CKPT_DIR --finetune \
        --tensor-model-parallel-size 2

Written at TP=1/PP=1; it loads at any TP/PP (weights only: use --finetune). Our own exports
are recognized by config.json["fixed_code"] and verified against the code. See docs/export.md.
"""

import argparse
import sys
import warnings

from megatron_fixedcode.arguments.user_errors import ArgumentParser, user_errors

warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex).*", category=UserWarning)


@user_errors
def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hf-dir", required=True, help="directory with config.json and safetensors")
    p.add_argument("--save", required=True, help="checkpoint root to create")
    p.add_argument("--seq-length", type=int, default=None, help="default: max_position_embeddings")
    p.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    a = p.parse_args(argv)
    from megatron_fixedcode.export.from_hf import convert_hf_to_megatron

    out = convert_hf_to_megatron(
        a.hf_dir, a.save, seq_length=a.seq_length, make_vocab_size_divisible_by=a.make_vocab_size_divisible_by
    )
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
