"""Table-free fixed-code Llama for ``transformers`` (remote code, copied into an export directory).

x(t) = scale · R · (A·c(t) ⊕ b): bit i of the recoded code is parity(t & row_mask_i) ⊕ b_i, tiled
along the width. No embedding table is stored or allocated. Load with
``AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)``. This file depends only on
torch and transformers (it is not part of megatron_fixedcode at run time).
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


class FixedCodeLlamaConfig(LlamaConfig):
    model_type = "fixedcode_llama"


class TableFreeCodeEmbedding(torch.nn.Module):
    """ids ``[B, S]`` → ``[B, S, H]``; holds Python ints only (nothing to load, nothing to train)."""

    def __init__(self, fixed_code: dict, dtype_of):
        super().__init__()
        self.vocab_size = int(fixed_code["vocab_size"])
        self.num_bits = int(fixed_code["num_bits"])
        self.hidden_size = int(fixed_code["hidden_size"])
        self.scale = float(fixed_code["scale"])
        self.row_masks = [sum(int(b) << j for j, b in enumerate(row)) for row in fixed_code["matrix"]]
        self.offset = [int(b) for b in fixed_code["offset"]]
        self._dtype_of = dtype_of  # a callable, not a submodule

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= self.vocab_size):
            raise ValueError(f"input_ids outside the code's vocabulary [0, {self.vocab_size})")
        masks = torch.tensor(self.row_masks, dtype=torch.int64, device=input_ids.device)
        offset = torch.tensor(self.offset, dtype=torch.int64, device=input_ids.device)
        bits = input_ids.to(torch.int64).unsqueeze(-1) & masks
        shift = 1
        while shift < self.num_bits:
            shift *= 2
        while shift > 1:  # XOR-fold the K bits onto bit 0: parity
            shift //= 2
            bits = bits ^ (bits >> shift)
        bits = (bits & 1) ^ offset
        tiles = -(-self.hidden_size // self.num_bits)
        x = bits.to(self._dtype_of()).repeat(*([1] * (bits.dim() - 1)), tiles)
        x = x[..., : self.hidden_size]
        return x * self.scale if self.scale != 1.0 else x


class FixedCodeLlamaForCausalLM(LlamaForCausalLM):
    config_class = FixedCodeLlamaConfig
    _keys_to_ignore_on_load_missing = [r"model\.embed_tokens\.weight"]

    def __init__(self, config):
        super().__init__(config)
        norm = self.model.norm
        self.model.embed_tokens = TableFreeCodeEmbedding(config.fixed_code, lambda: norm.weight.dtype)

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def resize_token_embeddings(self, *args, **kwargs):
        raise NotImplementedError("a fixed code has no table to resize")
