"""What ``tools/evaluate.py`` runs: perplexity of a megatron checkpoint or an HF export."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from megatron_fixedcode.eval.perplexity import (
    default_device,
    document_nll,
    hf_logits_fn,
    indexed_documents,
    megatron_logits_fn,
    text_documents,
)

DTYPES = ("float32", "bfloat16", "float16")


def _torch_dtype(dtype: str):
    import torch

    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    return getattr(torch, dtype)


def check_megatron_dtype(dtype: str) -> None:
    """A megatron checkpoint evaluates in float32 (its training precision is a recipe, not a load
    option): another ``--dtype`` is for ``--hf-model``."""
    if dtype != "float32":
        raise ValueError(
            f"--dtype {dtype} applies to --hf-model; --load evaluates in float32 (export the "
            "checkpoint with tools/convert_checkpoint_to_hf.py to evaluate it in another dtype)"
        )


def _megatron_on(model, device: str | None, dtype: str):
    """The loaded checkpoint's model on ``device`` (default :func:`default_device`)."""
    check_megatron_dtype(dtype)
    return model.to(device or default_device())


def _hf_model(model_dir: str, *, trust_remote_code: bool, device: str | None, dtype: str):
    from megatron_fixedcode.export import hf_io
    from megatron_fixedcode.utils.lazy import require

    transformers = require("transformers", "hf", "evaluate --hf-model")
    hf_io.read_config(model_dir)  # an incomplete export: one line, not transformers' traceback
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, trust_remote_code=trust_remote_code, dtype=_torch_dtype(dtype)
    )
    return transformers.AutoTokenizer.from_pretrained(model_dir), model.to(device or default_device()).eval()


BOS_NOTE = (
    "each document is [EOD] + tokens; EOD is unscored context (for the canonical and zero-offset "
    "GF(2) codes token 0 is the zero input vector)"
)


def _documents(tokenize, text_files, data_path) -> tuple[list[list[int]], dict]:
    if bool(text_files) == bool(data_path):
        raise ValueError("give exactly one of --text-files or --data-path")
    if text_files:
        return text_documents(text_files, tokenize), {"text_files": [str(p) for p in text_files]}
    docs = [d for prefix in data_path for d in indexed_documents(prefix)]
    return docs, {"data_path": list(data_path)}


def _checkpoint_tokenizer(ckpt, load: str, tokenizer_model: str | None, required: bool):
    """(tokenizer or None, its record for the result). A ``--tokenizer-model`` override must be the
    checkpoint's tokenizer (its fingerprint, where it was trained with one) and fit the model's
    vocabulary: another tokenizer gives a loss, silently, of the wrong thing."""
    from megatron_fixedcode.tokenizers import build_tokenizer, checkpoint_tokenizer_files

    tok_info = ckpt.trainer_state.get("tokenizer") or {}
    saved = (ckpt.trainer_state.get("identity") or {}).get("tokenizer_fingerprint")
    # the copy the checkpoint carries (relative to where it lies now), else the path it recorded
    path, merges = checkpoint_tokenizer_files(tok_info, ckpt.path.parent, f"--load {load}", tokenizer_model, saved)
    if not path:
        if required:
            raise ValueError(f"--load {load}: the checkpoint names no tokenizer; pass --tokenizer-model")
        return None, None
    tokenizer = build_tokenizer(tok_info.get("type") or "HuggingFaceTokenizer", path, merge_file=merges)
    if tokenizer.vocab_size > ckpt.model_cfg.vocab_size:
        raise ValueError(
            f"--tokenizer-model {path}: vocabulary {tokenizer.vocab_size} is larger than the model's "
            f"{ckpt.model_cfg.vocab_size} (--load {load})"
        )
    return tokenizer, {"model": str(path), "fingerprint": tokenizer.fingerprint, "vocab_size": tokenizer.vocab_size}


def checkpoint_perplexity(
    load: str,
    *,
    step: int | None = None,
    text_files=None,
    data_path=None,
    seq_length: int | None = None,
    batch_size: int = 8,
    max_tokens: int | None = None,
    tokenizer_model: str | None = None,
    verify: bool = True,
    device: str | None = None,
    dtype: str = "float32",
) -> dict[str, Any]:
    """Single process, TP=1/PP=1: the checkpoint is resharded on load, whatever layout saved it."""
    from megatron_fixedcode.checkpoint.single_process import load_megatron_checkpoint

    ckpt = load_megatron_checkpoint(load, step, verify=verify)
    tokenizer, tokenizer_record = _checkpoint_tokenizer(ckpt, load, tokenizer_model, required=bool(text_files))
    docs, source = _documents(tokenizer.tokenize if tokenizer else None, text_files, data_path)
    cfg = ckpt.model_cfg
    model = _megatron_on(ckpt.model, device, dtype)
    result = document_nll(
        megatron_logits_fn(model, cfg.vocab_size),
        docs,
        seq_length=seq_length or cfg.seq_length,
        eod=tokenizer.eod if tokenizer else 0,
        batch_size=batch_size,
        max_tokens=max_tokens,
    )
    return {
        **result,
        **source,
        "model": str(ckpt.path),
        "step": ckpt.step,
        "input_embedding": cfg.input_embedding,
        "code_fingerprint": ckpt.trainer_state["identity"]["code_fingerprint"],
        "tokenizer": tokenizer_record,
        "bos": BOS_NOTE,
        "device": str(next(model.parameters()).device),
        "dtype": dtype,
    }


def hf_perplexity(
    model_dir: str,
    *,
    text_files=None,
    data_path=None,
    seq_length: int | None = None,
    batch_size: int = 8,
    max_tokens: int | None = None,
    trust_remote_code: bool = False,
    device: str | None = None,
    dtype: str = "float32",
) -> dict[str, Any]:
    """The same protocol with plain ``transformers`` on an export (or any causal LM directory)."""
    tokenizer, model = _hf_model(model_dir, trust_remote_code=trust_remote_code, device=device, dtype=dtype)
    docs, source = _documents(lambda t: tokenizer(t, add_special_tokens=False)["input_ids"], text_files, data_path)
    config = model.config
    result = document_nll(
        hf_logits_fn(model),
        docs,
        seq_length=seq_length or config.max_position_embeddings,
        eod=tokenizer.eos_token_id,
        batch_size=batch_size,
        max_tokens=max_tokens,
    )
    fixed = getattr(config, "fixed_code", None)
    return {
        **result,
        **source,
        "model": str(Path(model_dir)),
        "input_embedding": fixed["input_embedding"] if fixed else "learned",
        "code_fingerprint": fixed["fingerprint"] if fixed else "learned",
        "tokenizer": {"model": str(Path(model_dir)), "vocab_size": len(tokenizer)},
        "bos": BOS_NOTE,
        "device": str(model.device),
        "dtype": dtype,
    }


def _target_examples(tokenizer, *, squad=None, sft_data=None, sft_fields=None) -> tuple[list, str, dict]:
    """(examples, which end to keep when too long, what was read) for --squad or --sft-data."""
    from megatron_fixedcode.eval.gold_answer import squad_examples

    if bool(squad) == bool(sft_data):
        raise ValueError("give exactly one of --squad or --sft-data")
    if squad:
        examples, skipped = squad_examples(squad, tokenizer.tokenize)
        return examples, "right", {"task": "squad_gold_answer", "squad": str(squad), "unanswerable_skipped": skipped}
    from megatron_fixedcode.data.sft import SFTFields, read_sft_jsonl

    records = [
        ex
        for path in sft_data
        for ex in read_sft_jsonl(path, sft_fields or SFTFields(), tokenizer.tokenize, tokenizer.eod)
    ]
    return (
        [(list(e.ids), list(e.target)) for e in records],
        "left",
        {"task": "sft_response", "sft_data": list(sft_data)},
    )


def checkpoint_target_perplexity(
    load: str,
    *,
    step: int | None = None,
    squad=None,
    sft_data=None,
    sft_fields=None,
    seq_length: int | None = None,
    batch_size: int = 8,
    tokenizer_model: str | None = None,
    verify: bool = True,
    device: str | None = None,
    dtype: str = "float32",
) -> dict[str, Any]:
    """SQuAD gold-answer or held-out SFT response perplexity of a megatron checkpoint (TP=1/PP=1)."""
    from megatron_fixedcode.checkpoint.single_process import load_megatron_checkpoint
    from megatron_fixedcode.eval.gold_answer import target_nll

    ckpt = load_megatron_checkpoint(load, step, verify=verify)
    tokenizer, tokenizer_record = _checkpoint_tokenizer(ckpt, load, tokenizer_model, required=True)
    examples, keep, source = _target_examples(tokenizer, squad=squad, sft_data=sft_data, sft_fields=sft_fields)
    cfg = ckpt.model_cfg
    pad = tokenizer.pad if tokenizer.pad is not None else tokenizer.eod
    model = _megatron_on(ckpt.model, device, dtype)
    result = target_nll(
        megatron_logits_fn(model, cfg.vocab_size),
        examples,
        seq_length=seq_length or cfg.seq_length,
        pad_id=pad,
        keep=keep,
        batch_size=batch_size,
    )
    return {
        **result,
        **source,
        "model": str(ckpt.path),
        "step": ckpt.step,
        "input_embedding": cfg.input_embedding,
        "code_fingerprint": ckpt.trainer_state["identity"]["code_fingerprint"],
        "tokenizer": tokenizer_record,
    }


def hf_target_perplexity(
    model_dir: str,
    *,
    squad=None,
    sft_data=None,
    sft_fields=None,
    seq_length: int | None = None,
    batch_size: int = 8,
    trust_remote_code: bool = False,
    device: str | None = None,
    dtype: str = "float32",
) -> dict[str, Any]:
    """The same measure with plain ``transformers`` on an export."""
    import types

    from megatron_fixedcode.eval.gold_answer import target_nll

    hf_tok, model = _hf_model(model_dir, trust_remote_code=trust_remote_code, device=device, dtype=dtype)
    tokenizer = types.SimpleNamespace(
        tokenize=lambda t: hf_tok(t, add_special_tokens=False)["input_ids"], eod=hf_tok.eos_token_id
    )
    examples, keep, source = _target_examples(tokenizer, squad=squad, sft_data=sft_data, sft_fields=sft_fields)
    config = model.config
    pad = hf_tok.pad_token_id if hf_tok.pad_token_id is not None else hf_tok.eos_token_id
    result = target_nll(
        hf_logits_fn(model),
        examples,
        seq_length=seq_length or config.max_position_embeddings,
        pad_id=pad,
        keep=keep,
        batch_size=batch_size,
    )
    fixed = getattr(config, "fixed_code", None)
    return {
        **result,
        **source,
        "model": str(Path(model_dir)),
        "input_embedding": fixed["input_embedding"] if fixed else "learned",
        "code_fingerprint": fixed["fingerprint"] if fixed else "learned",
    }
