"""`FixedCodeEmbedding`: the fixed binary token code as a drop-in for megatron's
`LanguageModelEmbedding` (input ids ``[b, s]`` → ``[s, b, h]``), with zero trainable parameters.

Shape legend: B batch, S sequence (S_local = this rank's shard), K code bits, H hidden size.

Under sequence parallelism each tensor-parallel rank computes the code of only the positions it
owns; under context parallelism the ids are already this rank's chunk. Nothing is communicated.
"""
from __future__ import annotations

import json
from typing import Any

import torch
from megatron.core import tensor_parallel
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron_fixedcode.codes import CodeSpec


def _parity_fold_shifts(num_bits: int) -> list[int]:
    """Shifts that fold bits 0..K-1 of an integer onto bit 0 by XOR (parity)."""
    shifts, s = [], 1
    while s < num_bits:
        shifts.append(s)
        s *= 2
    return shifts[::-1]


def activation_dtype(config: TransformerConfig) -> torch.dtype:
    """The dtype a learned embedding would emit under this config."""
    if config.fp32_residual_connection:
        return torch.float32
    if config.bf16:
        return torch.bfloat16
    if config.fp16:
        return torch.float16
    return config.params_dtype


class FixedCodeEmbedding(MegatronModule):
    """x(t) = scale · R · (A·c(t) ⊕ b); see ``codes.CodeSpec``.

    ``table_free`` computes bits from the ids (bit i = parity(id & row_mask_i) ⊕ b_i);
    ``lookup`` gathers rows of a persistent V×K codebook buffer. Both give identical 0/1 codes,
    hence bit-identical inputs. The buffers are integers, so ``.half()``/``.bfloat16()`` leave
    them alone, and they are saved with the model but never trained.
    """

    def __init__(
        self,
        config: TransformerConfig,
        code_spec: CodeSpec,
        position_embedding_type: str = "rope",
        scatter_to_sequence_parallel: bool = True,
        tp_group: torch.distributed.ProcessGroup | None = None,
        **unused_language_model_embedding_kwargs: Any,
    ):
        super().__init__(config=config)
        if position_embedding_type == "learned_absolute":
            raise ValueError(
                "position_embedding_type='learned_absolute' would add a trainable table next to the "
                "fixed code; use 'rope' (the papers) or 'none'"
            )
        if code_spec.hidden_size != config.hidden_size:
            raise ValueError(
                f"code hidden_size={code_spec.hidden_size} != model hidden_size={config.hidden_size}"
            )
        self.code_spec = code_spec
        self.scatter_to_sequence_parallel = scatter_to_sequence_parallel
        self.tp_group = tp_group
        self.output_dtype = activation_dtype(config)
        self.embedding_dropout = torch.nn.Dropout(config.hidden_dropout)
        self._fold_shifts = _parity_fold_shifts(code_spec.num_bits)
        self.register_buffer(
            "row_masks_K", torch.tensor(code_spec.row_masks(), dtype=torch.int64), persistent=True
        )
        self.register_buffer(
            "offset_K", torch.tensor(code_spec.offset, dtype=torch.int64), persistent=True
        )
        if code_spec.implementation == "lookup":
            codebook = torch.from_numpy(code_spec.codebook())
            self.register_buffer("codebook_VK", codebook, persistent=True)
        else:
            self.codebook_VK = None

    # --- the code ------------------------------------------------------------------------
    def check_token_ids(self, input_ids: torch.Tensor) -> None:
        """Ids outside [0, V) would alias another token's code: refuse them."""
        vocab_size = self.code_spec.vocab_size
        if input_ids.is_cuda:
            torch._assert_async(((input_ids >= 0) & (input_ids < vocab_size)).all())
            return
        if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab_size):
            bad = input_ids[(input_ids < 0) | (input_ids >= vocab_size)][0].item()
            raise ValueError(f"input_ids contain {bad}, outside the code's vocabulary [0, {vocab_size})")

    def code_bits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Recoded bits ``[..., K]`` of 0/1 (uint8 from the lookup buffer, int64 table-free)."""
        if self.codebook_VK is not None:
            return self.codebook_VK[input_ids]
        bits = input_ids.to(torch.int64).unsqueeze(-1) & self.row_masks_K
        for shift in self._fold_shifts:
            bits = bits ^ (bits >> shift)
        return (bits & 1) ^ self.offset_K

    def lift(self, bits_SBK: torch.Tensor) -> torch.Tensor:
        """Tile the K bits along the width (R), truncating the last tile, in the output dtype.

        The K-wide codes are converted and scaled first, then written once into a fresh output
        (a broadcast copy, no intermediate of the output's size); the values are the same as
        tiling first and scaling after, element for element."""
        num_bits, hidden = self.code_spec.num_bits, self.config.hidden_size
        bits = bits_SBK.to(self.output_dtype)
        if self.code_spec.scale != 1.0:
            bits = bits * self.code_spec.scale
        num_tiles, rest = divmod(hidden, num_bits)
        x_SBH = torch.empty(*bits.shape[:-1], hidden, dtype=bits.dtype, device=bits.device)
        x_SBH[..., : num_tiles * num_bits].unflatten(-1, (num_tiles, num_bits)).copy_(bits.unsqueeze(-2))
        if rest:
            x_SBH[..., num_tiles * num_bits :] = bits[..., :rest]
        return x_SBH

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                tokentype_ids: torch.Tensor | None = None) -> torch.Tensor:
        if tokentype_ids is not None:
            raise ValueError("FixedCodeEmbedding has no token-type embeddings")
        self.check_token_ids(input_ids)
        ids_SB = input_ids.t()
        sequence_parallel = self.config.sequence_parallel and self.scatter_to_sequence_parallel
        if sequence_parallel:
            # Each TP rank owns a contiguous 1/tp slice of the sequence: compute only that.
            tp_size = self.tp_group.size()
            s_local = ids_SB.shape[0] // tp_size
            start = self.tp_group.rank() * s_local
            ids_SB = ids_SB[start : start + s_local]
        x_SBH = self.lift(self.code_bits(ids_SB))
        if self.config.recompute_granularity == "full" and torch.is_grad_enabled():
            # megatron's reentrant activation checkpoint only backpropagates into the layers it
            # wraps if one of its inputs requires grad; a fixed code otherwise has none.
            x_SBH.requires_grad_(True)
        if self.embedding_dropout.p > 0:
            if sequence_parallel:
                with tensor_parallel.get_cuda_rng_tracker().fork():
                    x_SBH = self.embedding_dropout(x_SBH)
            else:
                x_SBH = self.embedding_dropout(x_SBH)
        return x_SBH

    # --- checkpoint identity -------------------------------------------------------------
    def get_extra_state(self) -> dict[str, Any]:
        return {"code_spec": json.dumps(self.code_spec.to_dict(), sort_keys=True)}

    def set_extra_state(self, state: Any) -> None:
        if state is None:
            return
        if isinstance(state, torch.Tensor):  # some loaders hand back an (empty) byte tensor
            if state.numel() == 0:
                return
            raise ValueError("unexpected tensor extra state in FixedCodeEmbedding checkpoint")
        stored = CodeSpec.from_dict(json.loads(state["code_spec"]))
        if stored.fingerprint != self.code_spec.fingerprint:
            raise ValueError(
                f"checkpoint was trained with input code {stored.kind} (fingerprint "
                f"{stored.fingerprint}) but this model uses {self.code_spec.kind} (fingerprint "
                f"{self.code_spec.fingerprint}); refusing to load a different token→vector map"
            )
