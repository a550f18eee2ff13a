"""Helpers for export/import/eval tests: tiny in-process checkpoints, HF logits, greedy decoding."""

from __future__ import annotations

import os
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

TINY_MODEL = dict(
    num_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    ffn_hidden_size=128,
    seq_length=32,
    vocab_size=1000,
    make_vocab_size_divisible_by=8,
    transformer_impl="local",
)


def random_checkpoint(root: Path, tokenizer_model: str | None = None, seed: int = 0, **fields) -> Path:
    """A checkpoint of a randomly initialized model (std 0.2, so logits are far from uniform),
    written the way the trainer writes one; returns the checkpoint root."""
    from megatron_fixedcode.checkpoint.single_process import build_single_rank_model, save_megatron_checkpoint
    from megatron_fixedcode.export.from_hf import trainer_state_for
    from megatron_fixedcode.models import ModelConfig

    cfg = ModelConfig(**{**TINY_MODEL, "init_method_std": 0.2, **fields})
    torch.manual_seed(seed)
    model = build_single_rank_model(cfg)
    with torch.no_grad():  # norms away from 1 so a swapped norm would show
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1 + 0.3 * torch.randn_like(p) if name.endswith("weight") else 0.3 * torch.randn_like(p))
    tok = {"type": "HuggingFaceTokenizer", "model": tokenizer_model} if tokenizer_model else None
    save_megatron_checkpoint(root, model, trainer_state_for(cfg, tok, "test"))
    return root


def hf_logits(model_dir: Path, ids_BS: torch.Tensor, trust_remote_code: bool = False) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, trust_remote_code=trust_remote_code).eval()
    with torch.no_grad():
        return model(ids_BS).logits.float()


def megatron_greedy(model, ids_1S: torch.Tensor, vocab_size: int, num_new: int) -> list[int]:
    from megatron_fixedcode.checkpoint import megatron_logits

    ids = ids_1S.clone()
    for _ in range(num_new):
        nxt = megatron_logits(model, ids, vocab_size)[0, -1].argmax()
        ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    return ids[0, ids_1S.shape[1] :].tolist()


def hf_greedy(model_dir: Path, ids_1S: torch.Tensor, num_new: int, trust_remote_code: bool = False) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, trust_remote_code=trust_remote_code).eval()
    out = model.generate(
        ids_1S,
        attention_mask=torch.ones_like(ids_1S),
        max_new_tokens=num_new,
        min_new_tokens=num_new,
        do_sample=False,
        pad_token_id=0,
    )
    return out[0, ids_1S.shape[1] :].tolist()
