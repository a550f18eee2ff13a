"""Convert a megatron-fixedcode checkpoint (saved under any TP/PP) to a Hugging Face directory.

    python tools/convert_checkpoint_to_hf.py --load CKPT_DIR --output HF_DIR [--table-free]

The llama block becomes LlamaForCausalLM (a fixed code as a frozen embed_tokens table that plain
transformers loads); the gpt_gelu block becomes GPTNeoXForCausalLM; Megatron-LM's GPT-2 block
(linear biases, learned positions) GPT2LMHeadModel. The export is then loaded with transformers
and compared with the checkpoint on the same tokens (HF_DIR/parity.json, one summary line); exit
code 3 when it does not match (the export stays, with parity.json passed=false). See docs/export.md.
"""

import argparse
import json
import sys
import warnings

from megatron_fixedcode.arguments.user_errors import ArgumentParser, user_errors

warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex).*", category=UserWarning)


@user_errors
def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--load", required=True, help="checkpoint root (with latest_checkpointed_iteration.txt) or an iter_* dir"
    )
    p.add_argument("--output", required=True, help="Hugging Face directory to write")
    p.add_argument("--ckpt-step", type=int, default=None, help="iteration to convert (default: the latest)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument(
        "--table-free",
        action="store_true",
        help="store no input table; write modeling_fixedcode.py (load with trust_remote_code=True)",
    )
    p.add_argument("--max-shard-size", default="5GB")
    p.add_argument("--tokenizer-model", default=None, help="override the tokenizer path recorded in the checkpoint")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument(
        "--no-parity-check",
        dest="parity_check",
        action="store_false",
        help="skip loading the export with transformers and comparing its logits with the checkpoint's "
        "(it holds both models in FP32: for very large models on small machines)",
    )
    p.add_argument(
        "--no-verify-checkpoint",
        dest="verify_checkpoint",
        action="store_false",
        help="convert without checking the checkpoint's recorded checksums",
    )
    a = p.parse_args(argv)
    from megatron_fixedcode.export.parity import REPORT_FILE, ParityFailed, summary
    from megatron_fixedcode.export.to_hf import convert_checkpoint_to_hf

    try:
        out = convert_checkpoint_to_hf(
            a.load,
            a.output,
            step=a.ckpt_step,
            dtype=a.dtype,
            table_free=a.table_free,
            max_shard_size=a.max_shard_size,
            tokenizer_model=a.tokenizer_model,
            overwrite=a.overwrite,
            verify=a.verify_checkpoint,
            parity=a.parity_check,
        )
    except ParityFailed as e:
        print(f"mfc-convert-checkpoint-to-hf: {e} (written: {a.output}; see its {REPORT_FILE})", file=sys.stderr)
        return 3
    if a.parity_check and (out / REPORT_FILE).exists():  # absent when transformers is not installed (said above)
        print(summary(json.loads((out / REPORT_FILE).read_text())), file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
