"""A Hugging Face Llama directory → a megatron checkpoint the trainer loads at any TP/PP.

The checkpoint is written at TP=1/PP=1 with ``dist_checkpointing`` (which reshards on load) and
the common-state ``trainer`` dict the trainer reads. It holds weights only: resume training
from it with ``--load DIR --finetune``. Our own exports are recognized by
``config.json["fixed_code"]``: the code is rebuilt from the recorded spec, its fingerprint must
match, and a stored ``embed_tokens`` table must equal the code's vectors exactly.
"""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import torch

from megatron_fixedcode.codes import CodeSpec
from megatron_fixedcode.export import hf_io
from megatron_fixedcode.export.llama import fixed_code_table, llama_to_megatron, model_config_from_llama
from megatron_fixedcode.export.megatron_io import build_single_rank_model, save_megatron_checkpoint
from megatron_fixedcode.models.config import ModelConfig

logger = logging.getLogger(__name__)
LLAMA_ARCHITECTURES = ("LlamaForCausalLM", "FixedCodeLlamaForCausalLM")
# The trainer compares these with its own run unless --finetune; None never matches.
STREAM_KEYS = ("global_batch_size", "seq_length", "seed", "dataset_type", "data_path", "valid_data_path",
               "samples_per_shard_visit", "num_train_samples")


def trainer_state_for(cfg: ModelConfig, tokenizer: dict[str, Any] | None, source: str) -> dict[str, Any]:
    """The common-state ``trainer`` dict of a weights-only checkpoint (step 0, no data stream)."""
    code = cfg.code_spec()
    return {
        "step": 0, "tokens": 0,
        "identity": {"input_embedding": cfg.input_embedding, "code_fingerprint": code.fingerprint if code else "learned"},
        **{key: None for key in STREAM_KEYS},
        "model_config": dataclasses.asdict(cfg),
        "code_spec": code.to_dict() if code else None,
        "tokenizer": tokenizer or {"type": None, "model": None},
        "run_config": {"imported_from": source},
        "layout": {"world_size": 1, "tp_size": 1, "pp_size": 1, "dp_size": 1},
    }


def recorded_code(config: dict[str, Any]) -> CodeSpec | None:
    """The CodeSpec in ``config.json["fixed_code"]`` (its stored fingerprint is re-verified)."""
    fixed = config.get("fixed_code")
    if fixed is None:
        return None
    fields = {f.name for f in dataclasses.fields(CodeSpec)} | {"fingerprint"}
    return CodeSpec.from_dict({k: v for k, v in fixed.items() if k in fields})


def _tokenizer_record(model_dir: Path, vocab_size: int) -> dict[str, Any] | None:
    from megatron_fixedcode.tokenizers import build_tokenizer

    for name, kind in (("tokenizer.json", "HuggingFaceTokenizer"), ("tokenizer.model", "SentencePieceTokenizer")):
        path = model_dir / name
        if path.is_file():
            tok = build_tokenizer(kind, str(path))
            if tok.vocab_size != vocab_size:
                raise ValueError(f"{path}: {tok.vocab_size} tokens, but config.json has vocab_size={vocab_size}")
            return {"type": kind, "model": str(path.resolve())}
    logger.warning("%s has no tokenizer.json or tokenizer.model: train with --vocab-size on pre-tokenized data", model_dir)
    return None


def convert_hf_to_megatron(hf_dir: str | Path, save: str | Path, *, seq_length: int | None = None,
                           make_vocab_size_divisible_by: int = 128) -> Path:
    """Write ``save/iter_0000000`` + ``latest_checkpointed_iteration.txt``; returns the iter dir."""
    hf_dir = Path(hf_dir)
    config = hf_io.read_config(hf_dir)
    arch = (config.get("architectures") or ["?"])[0]
    if arch not in LLAMA_ARCHITECTURES:
        raise ValueError(f"{hf_dir}/config.json: architecture {arch} is not supported (Llama only)")
    cfg = model_config_from_llama(config, seq_length=seq_length, make_vocab_size_divisible_by=make_vocab_size_divisible_by)
    tensors = {k: v.to(torch.float32) for k, v in hf_io.read_safetensors(hf_dir).items()}
    code = recorded_code(config)
    if code is not None:
        if cfg.code_spec().fingerprint != code.fingerprint:
            raise ValueError(f"{hf_dir}/config.json: fixed_code (fingerprint {code.fingerprint}) cannot be rebuilt from "
                             f"its seed (got {cfg.code_spec().fingerprint}); refusing to import a different code")
        table = tensors.pop("model.embed_tokens.weight", None)
        if table is not None and not torch.equal(table, fixed_code_table(code)):
            bad = int((table != fixed_code_table(code)).any(dim=1).sum())
            raise ValueError(f"{hf_dir}: embed_tokens.weight differs from the fixed code {code.fingerprint} in {bad} "
                             "rows (was it fine-tuned?); refusing to import it as that code")
    elif "model.embed_tokens.weight" not in tensors:
        raise ValueError(f"{hf_dir}: no model.embed_tokens.weight and no fixed_code in config.json")
    if "lm_head.weight" not in tensors:
        if not config.get("tie_word_embeddings", False):
            raise ValueError(f"{hf_dir}: no lm_head.weight")
        logger.warning("%s ties the head to the input table; importing an untied copy of it as the head", hf_dir)
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    padded = cfg.padded_vocab_size(1)
    model = build_single_rank_model(cfg)
    mapped = llama_to_megatron(tensors, cfg, padded)
    missing, unexpected = model.load_state_dict(mapped, strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state") and not k.startswith("embedding.")]
    if missing or unexpected:
        raise ValueError(f"{hf_dir}: weights do not fit the model (missing {missing[:5]}, unexpected {unexpected[:5]})")
    state = trainer_state_for(cfg, _tokenizer_record(hf_dir, cfg.vocab_size), str(hf_dir.resolve()))
    return save_megatron_checkpoint(save, model, state)
