"""A megatron checkpoint (any TP/PP) → a Hugging Face directory that plain ``transformers`` loads.

* ``llama`` block → ``LlamaForCausalLM``; ``gpt_gelu`` block → ``GPTNeoXForCausalLM`` (see
  ``gpt_neox.py`` for why that is exact); Megatron-LM's GPT-2 block → ``GPT2LMHeadModel`` (``gpt2.py``).
* A fixed code is exported as a frozen input table holding exactly ``scale·R·c~(t)``;
  ``config.json["fixed_code"]`` records the CodeSpec and its fingerprint.
* ``table_free=True`` stores no table and ships ``modeling_fixedcode.py`` (remote code).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import torch

from megatron_fixedcode.checkpoint.single_process import load_megatron_checkpoint
from megatron_fixedcode.export import hf_io
from megatron_fixedcode.export.gpt2 import gpt2_config, is_gpt2_block, megatron_to_gpt2
from megatron_fixedcode.export.gpt_neox import megatron_to_neox, neox_config
from megatron_fixedcode.export.llama import llama_config, megatron_to_llama
from megatron_fixedcode.models.config import ModelConfig
from megatron_fixedcode.utils.files import DiskFull, is_disk_full
from megatron_fixedcode.utils.finite import refuse_non_finite

logger = logging.getLogger(__name__)
REMOTE_CODE = Path(__file__).with_name("modeling_fixedcode.py")


def refuse_unmapped(cfg: ModelConfig) -> None:
    """What the Llama and GPT-NeoX exports cannot hold (the GPT-2 block has its own checks)."""
    if (
        cfg.kv_channels not in (None, cfg.hidden_size // cfg.num_attention_heads)
        or cfg.rotary_percent != 1.0
        or cfg.rotary_interleaved
    ):
        raise ValueError(
            f"kv_channels={cfg.kv_channels}, rotary_percent={cfg.rotary_percent}, rotary_interleaved="
            f"{cfg.rotary_interleaved}: the Hugging Face exports here map hidden/heads-wide heads with "
            "RoPE on every dim, in halves, only"
        )
    unmapped = {
        k: getattr(cfg, k)
        for k in (
            "add_bias_linear",
            "add_qkv_bias",
            "share_embeddings_and_output_weights",
            "qk_layernorm",
            "squared_relu",
            "rope_scaling",
        )
        if getattr(cfg, k)
    }
    if cfg.position_embedding_type != "rope":
        unmapped["position_embedding_type"] = cfg.position_embedding_type
    if unmapped:
        raise ValueError(
            f"{', '.join(f'{k}={v}' for k, v in unmapped.items())}: the Hugging Face exports here map "
            "bias-free RoPE blocks with an untied output layer (Llama, GPT-NeoX) and Megatron-LM's GPT-2 "
            "block (gpt_gelu with linear biases and learned or no positions: GPT2LMHeadModel) only"
        )


def hf_tensors_and_config(
    state: dict[str, torch.Tensor],
    cfg: ModelConfig,
    *,
    bos_token_id: int | None,
    eos_token_id: int | None,
    dtype: str = "float32",
    table_free: bool = False,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The exported tensors (cast to ``dtype``) and config.json for one TP=1 state dict."""
    if dtype not in hf_io.DTYPES:
        raise ValueError(f"--dtype {dtype!r}: choose one of {sorted(hf_io.DTYPES)}")
    ids = {"bos_token_id": bos_token_id, "eos_token_id": eos_token_id, "dtype": dtype}
    if is_gpt2_block(cfg):
        tensors, config = megatron_to_gpt2(state, cfg), gpt2_config(cfg, **ids)
    else:
        refuse_unmapped(cfg)
        if cfg.block == "llama":
            tensors, config = megatron_to_llama(state, cfg), llama_config(cfg, **ids)
        else:
            tensors, config = megatron_to_neox(state, cfg), neox_config(cfg, **ids)
    if table_free:
        if cfg.input_embedding == "learned":
            raise ValueError(
                "--table-free: the learned baseline has a real input table; export it without --table-free"
            )
        if cfg.block != "llama":
            raise ValueError(
                "--table-free is implemented for the llama block only; export gpt_gelu models with the frozen table"
            )
        del tensors["model.embed_tokens.weight"]
        config.update(
            architectures=["FixedCodeLlamaForCausalLM"],
            model_type="fixedcode_llama",
            auto_map={
                "AutoConfig": "modeling_fixedcode.FixedCodeLlamaConfig",
                "AutoModelForCausalLM": "modeling_fixedcode.FixedCodeLlamaForCausalLM",
            },
        )
    out = {k: v.to(hf_io.DTYPES[dtype]) for k, v in tensors.items()}
    refuse_non_finite(out.items(), f"export (--dtype {dtype})", "export it")
    return out, config


def write_hf_model(
    out_dir: str | Path,
    state: dict[str, torch.Tensor],
    cfg: ModelConfig,
    *,
    tokenizer_type: str | None = None,
    tokenizer_model: str | None = None,
    merge_file: str | None = None,
    dtype: str = "float32",
    table_free: bool = False,
    max_shard_size: str | int = "5GB",
    provenance: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write config.json, generation_config.json, safetensors (+ index) and tokenizer files into
    ``OUT.partial`` and rename it to ``OUT`` when complete: a killed or failed export leaves no
    directory under the final name (readers refuse the marked ``OUT.partial``)."""
    from megatron_fixedcode.utils.locks import PathLock

    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if not overwrite:
            raise ValueError(f"--output {out} exists and is not empty (pass --overwrite to replace it)")
        if not out.is_dir():
            raise ValueError(f"--output {out} is a file, not a directory")
    tokenizer = None
    if tokenizer_model:
        from megatron_fixedcode.tokenizers import build_tokenizer

        tokenizer = build_tokenizer(tokenizer_type or "HuggingFaceTokenizer", tokenizer_model, merge_file=merge_file)
        if tokenizer.vocab_size != cfg.vocab_size:
            raise ValueError(
                f"tokenizer {tokenizer_model} has {tokenizer.vocab_size} tokens, the model {cfg.vocab_size}"
            )
    eos = tokenizer.eod if tokenizer else None
    bos = (tokenizer.bos if tokenizer.bos is not None else tokenizer.eod) if tokenizer else None
    tensors, config = hf_tensors_and_config(
        state, cfg, bos_token_id=bos, eos_token_id=eos, dtype=dtype, table_free=table_free
    )
    if provenance:
        config["megatron_fixedcode"] = provenance
    out.parent.mkdir(parents=True, exist_ok=True)
    with PathLock(hf_io.lock_file(out), f"--output {out}"):  # one writer of OUT.partial at a time
        tmp = hf_io.begin_export(out)
        try:
            hf_io.write_safetensors(tmp, tensors, max_shard_size)
            hf_io.write_json(tmp / "config.json", config)
            hf_io.write_json(
                tmp / "generation_config.json",
                {"bos_token_id": bos, "eos_token_id": eos, "do_sample": False, "_from_model_config": True},
            )
            if table_free:
                shutil.copyfile(REMOTE_CODE, tmp / REMOTE_CODE.name)
            if tokenizer is not None:
                hf_io.write_tokenizer(tmp, tokenizer_type, tokenizer_model, tokenizer, cfg.seq_length)
            else:
                logger.warning(
                    "the checkpoint names no tokenizer (trained on pre-tokenized ids): no tokenizer files written"
                )
        except BaseException as e:
            shutil.rmtree(tmp, ignore_errors=True)  # nothing half-written stays behind
            if is_disk_full(e):
                raise DiskFull(tmp, e, f"the partial export was removed and {out} is as it was") from None
            raise
        return hf_io.finish_export(tmp, out)


def convert_checkpoint_to_hf(
    load: str | Path,
    output: str | Path,
    *,
    step: int | None = None,
    dtype: str = "float32",
    table_free: bool = False,
    max_shard_size: str | int = "5GB",
    tokenizer_model: str | None = None,
    overwrite: bool = False,
    verify: bool = True,
    parity: bool = False,
) -> Path:
    """Load ``load`` at TP=1/PP=1 (resharded from any layout) and write the HF directory;
    ``parity``: then check it against the checkpoint (``parity.json``; raises ``ParityFailed``)."""
    ckpt = load_megatron_checkpoint(load, step, verify=verify)
    tok = ckpt.trainer_state.get("tokenizer") or {}
    from megatron_fixedcode.tokenizers import checkpoint_tokenizer_files

    # the copy the checkpoint carries (relative to where it lies now), else the path it recorded
    tokenizer_model, merge_file = checkpoint_tokenizer_files(
        tok,
        ckpt.path.parent,
        f"--load {load}",
        tokenizer_model,
        (ckpt.trainer_state.get("identity") or {}).get("tokenizer_fingerprint"),
    )
    provenance = {
        "checkpoint": str(ckpt.path.resolve()),
        "step": ckpt.step,
        "tokens": ckpt.trainer_state.get("tokens"),
        "identity": ckpt.trainer_state.get("identity"),
        "layout": ckpt.trainer_state.get("layout"),
        "block": ckpt.model_cfg.block,
    }
    state = {k: v for k, v in ckpt.model.state_dict().items() if isinstance(v, torch.Tensor)}
    out = write_hf_model(
        output,
        state,
        ckpt.model_cfg,
        tokenizer_type=tok.get("type"),
        tokenizer_model=tokenizer_model,
        merge_file=merge_file,
        dtype=dtype,
        table_free=table_free,
        max_shard_size=max_shard_size,
        provenance=provenance,
        overwrite=overwrite,
    )
    if parity:
        import importlib.util

        del state
        if importlib.util.find_spec("transformers") is None:  # the core install: the export is written, unchecked
            logger.warning(
                "parity check skipped: transformers is not installed (pip install 'megatron-fixedcode[hf]'); "
                "check this export later with tools/check_hf_export.py --load %s --hf-dir %s",
                load,
                out,
            )
            return out
        from megatron_fixedcode.export.parity import checkpoint_tokenizer, verify_export

        verify_export(ckpt, out, checkpoint_tokenizer(ckpt, tokenizer_model))
    return out
