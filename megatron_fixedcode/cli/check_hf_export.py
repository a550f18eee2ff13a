"""Check an existing Hugging Face export against the checkpoint it came from.

    python tools/check_hf_export.py --load CKPT_DIR --hf-dir HF_DIR [--report parity.json]

Loads the checkpoint (any TP/PP, in one process) and the export (plain transformers, FP32), runs
the same tokens through both and prints one summary line; exit code 3 when the export does not
compute what the checkpoint computes (thresholds in docs/export.md), 0 when it does.
"""

import argparse
import json
import sys
import warnings
from pathlib import Path

from megatron_fixedcode.arguments.user_errors import ArgumentParser, user_errors

warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex).*", category=UserWarning)


@user_errors
def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--load", required=True, help="checkpoint root (with latest_checkpointed_iteration.txt) or an iter_* dir"
    )
    p.add_argument("--hf-dir", required=True, help="the Hugging Face export to check")
    p.add_argument("--ckpt-step", type=int, default=None, help="iteration exported (default: the latest)")
    p.add_argument("--tokenizer-model", default=None, help="override the tokenizer path recorded in the checkpoint")
    p.add_argument("--report", default=None, help="also write the report (JSON) to this file")
    p.add_argument(
        "--no-verify-checkpoint",
        dest="verify_checkpoint",
        action="store_false",
        help="check without verifying the checkpoint's recorded checksums",
    )
    a = p.parse_args(argv)
    from megatron_fixedcode.checkpoint.single_process import load_megatron_checkpoint
    from megatron_fixedcode.export.parity import check_export, checkpoint_tokenizer, summary

    ckpt = load_megatron_checkpoint(a.load, a.ckpt_step, verify=a.verify_checkpoint)
    report = check_export(ckpt, a.hf_dir, checkpoint_tokenizer(ckpt, a.tokenizer_model))
    if a.report:
        Path(a.report).write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    print(summary(report), file=sys.stderr)
    return 0 if report["passed"] else 3


if __name__ == "__main__":
    sys.exit(main())
