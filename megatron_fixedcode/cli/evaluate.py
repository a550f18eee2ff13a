"""Evaluate checkpoints and exports.

    python tools/evaluate.py --load CKPT --text-files F [F ...] --json      # megatron checkpoint, any TP/PP
    python tools/evaluate.py --hf-model HF_DIR --text-files F --json         # the same protocol in transformers
    python tools/evaluate.py --hf-model HF_DIR --tasks local --output r.json # LM Evaluation Harness
    python tools/evaluate.py --load CKPT --squad squad_dev.json --json       # SQuAD gold-answer perplexity
    python tools/evaluate.py --load CKPT --sft-data valid.jsonl --json       # held-out SFT response perplexity
    python tools/evaluate.py --compare a.json b.json ... --markdown cmp.md   # across models and seeds

See docs/evaluation.md for the protocol (document windows, EOD context, acc vs acc_norm).
"""

import argparse
import contextlib
import json
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex).*", category=UserWarning)

from megatron_fixedcode.arguments.user_errors import ArgumentParser, user_errors
from megatron_fixedcode.eval import tables


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--load", help="megatron checkpoint root or iter_* dir (loaded at TP=1/PP=1)")
    src.add_argument("--hf-model", help="Hugging Face directory (an export)")
    src.add_argument("--compare", nargs="+", help="result JSONs to aggregate (label/seed/reference keys)")
    p.add_argument("--ckpt-step", type=int, default=None)
    p.add_argument(
        "--no-verify-checkpoint",
        dest="verify_checkpoint",
        action="store_false",
        help="--load without checking the checkpoint's recorded checksums",
    )
    p.add_argument("--text-files", nargs="+", default=None, help="one document per file")
    p.add_argument("--data-path", nargs="+", default=None, help="indexed dataset prefixes (e.g. the validation split)")
    p.add_argument("--seq-length", type=int, default=None, help="window length (default: the model's)")
    p.add_argument("--max-tokens", type=int, default=None, help="stop after about this many targets")
    p.add_argument("--batch-size", type=int, default=8, help="windows (or harness requests) per forward pass")
    p.add_argument(
        "--device",
        default=None,
        help="torch device to evaluate on, e.g. cuda, cuda:1, cpu (default: cuda when torch sees a GPU)",
    )
    p.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16", "float16"),
        help="weights' dtype for --hf-model and --tasks (--load evaluates in float32); "
        "log-probabilities are always reduced in float64",
    )
    p.add_argument("--tokenizer-model", default=None, help="override the checkpoint's tokenizer path")
    p.add_argument(
        "--squad",
        default=None,
        help="SQuAD gold-answer perplexity: SQuAD .json or JSONL {context, question, answers} (docs/sft.md)",
    )
    p.add_argument(
        "--sft-data",
        nargs="+",
        default=None,
        help="held-out SFT JSONL: perplexity of the response tokens (+ EOD), encoded as in training",
    )
    p.add_argument("--sft-prompt-key", default="prompt")
    p.add_argument("--sft-response-key", default="response")
    p.add_argument("--sft-messages-key", default="messages")
    p.add_argument("--tasks", default=None, help="lm-eval: 'paper', 'local' or task[:shots],...")
    p.add_argument("--limit", type=float, default=None, help="lm-eval: examples per task (for smoke runs)")
    p.add_argument("--trust-remote-code", action="store_true", help="for --table-free exports")
    p.add_argument("--label", default=None, help="name of this model in reports (e.g. binary)")
    p.add_argument("--seed", type=int, default=None, help="training seed, for across-seed reports")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--output", default=None, help="write the JSON result here")
    p.add_argument("--markdown", default=None, help="write a markdown table here")
    return p


def _run(a) -> dict:
    from megatron_fixedcode.eval import run

    if a.hf_model and a.tokenizer_model:
        raise ValueError(
            f"--tokenizer-model applies to --load: the export --hf-model {a.hf_model} carries its own "
            "tokenizer (drop --tokenizer-model)"
        )

    if a.batch_size < 1:
        raise ValueError(f"--batch-size {a.batch_size}: must be at least 1")
    if a.load:
        run.check_megatron_dtype(a.dtype)  # before loading the checkpoint
    device = dict(device=a.device, dtype=a.dtype)
    common = dict(
        text_files=a.text_files,
        data_path=a.data_path,
        seq_length=a.seq_length,
        batch_size=a.batch_size,
        max_tokens=a.max_tokens,
        **device,
    )
    if a.squad or a.sft_data:
        from megatron_fixedcode.data.sft import SFTFields

        target = dict(
            squad=a.squad,
            sft_data=a.sft_data,
            seq_length=a.seq_length,
            batch_size=a.batch_size,
            sft_fields=SFTFields(a.sft_prompt_key, a.sft_response_key, a.sft_messages_key),
            **device,
        )
        if a.load:
            return run.checkpoint_target_perplexity(
                a.load, step=a.ckpt_step, tokenizer_model=a.tokenizer_model, verify=a.verify_checkpoint, **target
            )
        return run.hf_target_perplexity(a.hf_model, trust_remote_code=a.trust_remote_code, **target)
    if a.load:
        return run.checkpoint_perplexity(
            a.load, step=a.ckpt_step, tokenizer_model=a.tokenizer_model, verify=a.verify_checkpoint, **common
        )
    if a.tasks:
        from megatron_fixedcode.eval.harness import run_harness

        limit = int(a.limit) if a.limit and a.limit >= 1 else a.limit
        return run_harness(
            a.hf_model, a.tasks, limit=limit, batch_size=a.batch_size, trust_remote_code=a.trust_remote_code, **device
        )
    return run.hf_perplexity(a.hf_model, trust_remote_code=a.trust_remote_code, **common)


@user_errors
def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    if a.compare:
        results = [json.loads(Path(f).read_text()) for f in a.compare]
        out = tables.compare(results)
        md = tables.comparison_markdown(out)
    else:
        # stdout is the result only: what a library prints meanwhile (lm-eval 0.4.9's "bootstrapping
        # for stddev") goes to stderr, so `--json` output parses
        with contextlib.redirect_stdout(sys.stderr):
            out = _run(a)
        out.update({k: v for k, v in (("label", a.label), ("seed", a.seed)) if v is not None})
        md = tables.model_markdown(out)
    if a.output:
        Path(a.output).write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    if a.markdown:
        Path(a.markdown).write_text(md)
    print(json.dumps(out, sort_keys=True) if a.json else md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
