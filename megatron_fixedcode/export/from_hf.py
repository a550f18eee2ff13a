"""A Hugging Face Llama or GPT-2 directory → a megatron checkpoint the trainer loads at any TP/PP.

The checkpoint is written at TP=1/PP=1 with ``dist_checkpointing`` (which reshards on load) and
the common-state ``trainer`` dict the trainer reads. It holds weights only: resume training
from it with ``--load DIR --finetune``. Our own exports are recognized by
``config.json["fixed_code"]``: the code is rebuilt from the recorded spec, its fingerprint must
match, and a stored ``embed_tokens`` table must equal the code's vectors exactly.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path
from typing import Any

import torch

from megatron_fixedcode.checkpoint.single_process import build_single_rank_model, save_megatron_checkpoint
from megatron_fixedcode.codes import CodeSpec
from megatron_fixedcode.export import hf_io
from megatron_fixedcode.export.gpt2 import (
    GPT2_ARCHITECTURES,
    canonical_gpt2_names,
    gpt2_tensor_shapes,
    gpt2_to_megatron,
    model_config_from_gpt2,
)
from megatron_fixedcode.export.llama import (
    code_fields_from,
    fixed_code_table,
    llama_tensor_shapes,
    llama_to_megatron,
    model_config_from_llama,
)
from megatron_fixedcode.models.config import ModelConfig
from megatron_fixedcode.utils.finite import refuse_non_finite

logger = logging.getLogger(__name__)
LLAMA_ARCHITECTURES = ("LlamaForCausalLM", "FixedCodeLlamaForCausalLM")
# The trainer compares these with its own run unless --finetune; None never matches.
STREAM_KEYS = (
    "global_batch_size",
    "seq_length",
    "seed",
    "dataset_type",
    "data_path",
    "valid_data_path",
    "samples_per_shard_visit",
    "num_train_samples",
)


def trainer_state_for(cfg: ModelConfig, tokenizer: dict[str, Any] | None, source: str) -> dict[str, Any]:
    """The common-state ``trainer`` dict of a weights-only checkpoint (step 0, no data stream)."""
    code = cfg.code_spec()
    return {
        "step": 0,
        "tokens": 0,
        "identity": {
            "input_embedding": cfg.input_embedding,
            "code_fingerprint": code.fingerprint if code else "learned",
        },
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
    logger.warning(
        "%s has no tokenizer.json or tokenizer.model: train with --vocab-size on pre-tokenized data", model_dir
    )
    return None


def _config_error(hf_dir: Path, e: Exception) -> ValueError:
    what = f"no {e.args[0]!r}" if isinstance(e, KeyError) else str(e)
    return ValueError(f"{hf_dir}/config.json: {what}")


def check_tensors(
    hf_dir: Path, config: dict[str, Any], cfg: ModelConfig, found: dict[str, list[int]], code: CodeSpec | None
) -> None:
    """Every tensor in the safetensors is used and every tensor the model needs is there, with the
    shape config.json implies; otherwise one error naming them, before anything is loaded or
    written (a config.json with fewer layers than the weights would drop layers silently)."""
    gpt2 = cfg.block == "gpt_gelu"
    expected = gpt2_tensor_shapes(cfg) if gpt2 else llama_tensor_shapes(cfg)
    table = "transformer.wte.weight" if gpt2 else "model.embed_tokens.weight"
    optional = set()
    if code is not None:
        optional.add(table)  # the code's rows; checked against the code when stored
    if config.get("tie_word_embeddings", gpt2) and table in found:
        optional.add("lm_head.weight")  # tied to the input table
    missing = [k for k in expected if k not in found and k not in optional]
    unused = [k for k in found if k not in expected]
    wrong = [f"{k} {found[k]} (expected {expected[k]})" for k in expected if k in found and found[k] != expected[k]]
    if not (missing or unused or wrong):
        return
    layers = {int(m.group(1)) for k in found if (m := re.search(r"\.(?:layers|h)\.(\d+)\.", k))}
    parts = [
        f"config.json says {'n_layer' if gpt2 else 'num_hidden_layers'}={cfg.num_layers}, the safetensors hold "
        f"{len(layers)} layers"
        if layers != set(range(cfg.num_layers))
        else f"config.json: {cfg.num_layers} "
        f"layers, hidden {cfg.hidden_size}, FFN {cfg.ffn_hidden_size}, vocabulary {cfg.vocab_size}"
    ]
    for label, names in (("not used by the model", unused), ("missing", missing), ("of another shape", wrong)):
        if names:
            more = f" (+{len(names) - 10} more)" if len(names) > 10 else ""
            parts.append(f"{len(names)} tensors {label}: {', '.join(names[:10])}{more}")
    raise ValueError(f"{hf_dir}: the weights do not fit config.json; refusing to import ({'; '.join(parts)})")


def _model_config(
    config: dict[str, Any], arch: str, seq_length: int | None, make_vocab_size_divisible_by: int
) -> ModelConfig:
    if arch in LLAMA_ARCHITECTURES:
        return model_config_from_llama(
            config, seq_length=seq_length, make_vocab_size_divisible_by=make_vocab_size_divisible_by
        )
    fields = model_config_from_gpt2(
        config, seq_length=seq_length, make_vocab_size_divisible_by=make_vocab_size_divisible_by
    )
    fields.update(code_fields_from(config))
    if fields["input_embedding"] != "learned":  # our fixed-code GPT-2 export: no position table, untied head
        fields.update(position_embedding_type="none", share_embeddings_and_output_weights=False)
    return ModelConfig(**fields)


def _check_code_table(
    hf_dir: Path, tensors: dict[str, torch.Tensor], cfg: ModelConfig, code: CodeSpec, table_name: str
) -> None:
    if cfg.code_spec().fingerprint != code.fingerprint:
        raise ValueError(
            f"{hf_dir}/config.json: fixed_code (fingerprint {code.fingerprint}) cannot be rebuilt from "
            f"its seed (got {cfg.code_spec().fingerprint}); refusing to import a different code"
        )
    table = tensors.pop(table_name, None)
    if table is not None and not torch.equal(table, fixed_code_table(code)):
        bad = int((table != fixed_code_table(code)).any(dim=1).sum())
        raise ValueError(
            f"{hf_dir}: {table_name} differs from the fixed code {code.fingerprint} in {bad} "
            "rows (was it fine-tuned?); refusing to import it as that code"
        )
    wpe = tensors.pop("transformer.wpe.weight", None)
    if wpe is not None and wpe.any():
        raise ValueError(
            f"{hf_dir}: transformer.wpe.weight is not zero, but a fixed-code model has no position table "
            "(was it fine-tuned?); refusing to import it"
        )


def convert_hf_to_megatron(
    hf_dir: str | Path, save: str | Path, *, seq_length: int | None = None, make_vocab_size_divisible_by: int = 128
) -> Path:
    """Write ``save/iter_0000000`` + ``latest_checkpointed_iteration.txt``; returns the iter dir.
    Everything is checked before anything is written: an incomplete directory, a config.json
    that is not a Llama or GPT-2 we can build, and weights that do not fit it exactly are refused."""
    hf_dir = Path(hf_dir)
    config = hf_io.read_config(hf_dir)  # refuses an incomplete export
    arch = (config.get("architectures") or ["?"])[0]
    if arch not in LLAMA_ARCHITECTURES + GPT2_ARCHITECTURES:
        raise ValueError(f"{hf_dir}/config.json: architecture {arch} is not supported (Llama and GPT-2 only)")
    gpt2 = arch in GPT2_ARCHITECTURES
    try:
        cfg = _model_config(config, arch, seq_length, make_vocab_size_divisible_by)
        code = recorded_code(config)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise _config_error(hf_dir, e) from None
    found: dict[str, list[int]] = {}
    for name in hf_io.weight_files(hf_dir):
        found.update(hf_io.safetensors_shapes(hf_dir / name))
    check_tensors(hf_dir, config, cfg, canonical_gpt2_names(found) if gpt2 else found, code)
    tensors = {k: v.to(torch.float32) for k, v in hf_io.read_safetensors(hf_dir).items()}
    if gpt2:
        tensors = canonical_gpt2_names(tensors)
    refuse_non_finite(sorted(tensors.items()), str(hf_dir), "import it")
    table_name = "transformer.wte.weight" if gpt2 else "model.embed_tokens.weight"
    if not gpt2 and "lm_head.weight" not in tensors:
        logger.warning("%s ties the head to the input table; importing an untied copy of it as the head", hf_dir)
        tensors["lm_head.weight"] = tensors[table_name].clone()
    if code is not None:
        _check_code_table(hf_dir, tensors, cfg, code, table_name)
    padded = cfg.padded_vocab_size(1)
    model = build_single_rank_model(cfg)
    mapped = gpt2_to_megatron(tensors, cfg, padded) if gpt2 else llama_to_megatron(tensors, cfg, padded)
    missing, unexpected = model.load_state_dict(mapped, strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state") and not k.startswith("embedding.")]
    if missing or unexpected:  # check_tensors makes this unreachable unless the mapping itself is wrong
        raise ValueError(f"{hf_dir}: weights do not fit the model (missing {missing[:5]}, unexpected {unexpected[:5]})")
    state = trainer_state_for(cfg, _tokenizer_record(hf_dir, cfg.vocab_size), str(hf_dir.resolve()))
    return save_megatron_checkpoint(save, model, state)
