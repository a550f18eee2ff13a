"""`FixedCodeEmbedding`: the fixed binary token code as a drop-in for megatron's
`LanguageModelEmbedding` (input ids ``[b, s]`` → ``[s, b, h]``), with zero trainable parameters.

Shape legend: B batch, S sequence (S_local = this rank's shard), K code bits, H hidden size.

Under sequence parallelism each tensor-parallel rank computes the code of only the positions it
owns; under context parallelism the ids are already this rank's chunks (the trainer's forward step
cuts the batch with ``training.batches.split_for_context_parallel``). Nothing is communicated.
The bit tables are buffers: ``module.to(device)`` takes them along, and the forward runs on the
ids' device (the compiled kernel for CPU ids, torch ops for CUDA ids).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
import torch
from megatron.core import tensor_parallel
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron_fixedcode.codes import CodeSpec, bits_to_ids
from megatron_fixedcode.kernels import fixed_code_cpu_kernel
from megatron_fixedcode.models.config import CODE_KERNELS


def _parity_fold_shifts(num_bits: int) -> list[int]:
    """Shifts that fold bits 0..K-1 of an integer onto bit 0 by XOR (parity)."""
    shifts, s = [], 1
    while s < num_bits:
        shifts.append(s)
        s *= 2
    return shifts[::-1]


def _code_word_dtype(num_bits: int) -> torch.dtype:
    """The narrowest integer dtype that holds a K-bit code: its bytes, viewed as uint8, are the
    code's little-endian bytes (the index into ``byte_values``)."""
    for dtype in (torch.uint8, torch.int16, torch.int32, torch.int64):
        if num_bits <= torch.iinfo(dtype).bits:
            return dtype
    raise ValueError(f"num_bits={num_bits} does not fit an int64 code word")


def _to_code_words(packed: np.ndarray, num_bits: int) -> torch.Tensor:
    """int64 codes (bit i = code bit i, < 2^K) → the same bits in the narrowest code word
    (numpy's unsigned view reinterprets them as the two's complement of the signed dtype)."""
    dtype = _code_word_dtype(num_bits)
    unsigned = {torch.uint8: np.uint8, torch.int16: np.uint16, torch.int32: np.uint32, torch.int64: np.uint64}[dtype]
    return torch.from_numpy(np.ascontiguousarray(packed.astype(unsigned))).view(dtype)


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

    ``table_free`` computes the code from the ids; ``lookup`` gathers it from a persistent V×K
    codebook buffer. Both give identical 0/1 codes, hence bit-identical inputs. The buffers are
    integers, so ``.half()``/``.bfloat16()`` leave them alone; they are saved, never trained.

    The forward is one pass over the output: each token's code is packed into bytes (bit i = bit
    i % 8 of byte i // 8; table-free: XOR of 256-entry tables per byte of the id, A being
    GF(2)-linear), its K activation values are gathered byte by byte from a 256×8 table of
    ``bit_values``, and those K values are written once into every tile of a fresh output.
    ``code_bits`` → ``bit_values`` → ``lift`` is the reference it equals bit for bit (tests check
    every id). On CPU, ``kernel="auto"`` (the default) runs all of it as one compiled kernel
    (``kernels/fixed_code_cpu.cpp``, built on first use) when it can be built; ``"torch"`` keeps
    the torch ops, ``"fused"`` insists on the kernel.
    """

    def __init__(
        self,
        config: TransformerConfig,
        code_spec: CodeSpec,
        position_embedding_type: str = "rope",
        scatter_to_sequence_parallel: bool = True,
        tp_group: torch.distributed.ProcessGroup | None = None,
        kernel: str = "auto",
        **unused_language_model_embedding_kwargs: Any,
    ):
        super().__init__(config=config)
        if kernel not in CODE_KERNELS:
            raise ValueError(f"code kernel must be one of {CODE_KERNELS}, got {kernel!r}")
        self.kernel = kernel
        self._fused_cpu = kernel != "torch" and code_spec.family.bits  # see fused_forward
        if position_embedding_type == "learned_absolute":
            raise ValueError(
                "position_embedding_type='learned_absolute' would add a trainable table next to the "
                "fixed code; use 'rope' (the papers) or 'none'"
            )
        if code_spec.hidden_size != config.hidden_size:
            raise ValueError(f"code hidden_size={code_spec.hidden_size} != model hidden_size={config.hidden_size}")
        self.code_spec = code_spec
        self.scatter_to_sequence_parallel = scatter_to_sequence_parallel
        self.tp_group = tp_group
        self.output_dtype = activation_dtype(config)
        self.embedding_dropout = torch.nn.Dropout(config.hidden_dropout)
        if code_spec.family.bits:  # (float codes keep their own table: see code_embeddings.py)
            self._register_bit_code_buffers(code_spec)

    def _register_bit_code_buffers(self, code_spec: CodeSpec) -> None:
        if sys.byteorder != "little":  # code_values reads code words as little-endian bytes
            raise NotImplementedError("FixedCodeEmbedding needs a little-endian machine")
        self._fold_shifts = _parity_fold_shifts(code_spec.num_bits)
        self.register_buffer("row_masks_K", torch.tensor(code_spec.row_masks(), dtype=torch.int64), persistent=True)
        self.register_buffer("offset_K", torch.tensor(code_spec.offset, dtype=torch.int64), persistent=True)
        if code_spec.implementation == "lookup":
            codebook = torch.from_numpy(code_spec.codebook())
            self.register_buffer("codebook_VK", codebook, persistent=True)
            # Derived, not saved: the codebook's rows packed into code words (bit i = column i).
            self.register_buffer(
                "codebook_words_V", _to_code_words(bits_to_ids(codebook.numpy()), code_spec.num_bits), persistent=False
            )
        else:
            self.codebook_VK = None
            tables = code_spec.id_byte_tables()
            tables[0] ^= code_spec.offset_mask()  # XOR-ed once per id: fold b into byte 0's table
            self.register_buffer(
                "id_byte_code_words_J256", _to_code_words(tables, code_spec.num_bits), persistent=False
            )
        self._byte_values_cache: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
        self._bit_pair_values: torch.Tensor | None = None
        if self.kernel == "fused" and fixed_code_cpu_kernel() is None:
            raise RuntimeError("kernel='fused': the CPU fixed-code kernel could not be built (see the log)")

    # --- the code ------------------------------------------------------------------------
    def check_token_ids(self, input_ids: torch.Tensor) -> None:
        """Ids outside [0, V) would alias another token's code: refuse them."""
        vocab_size = self.code_spec.vocab_size
        if input_ids.is_cuda:
            torch._assert_async(((input_ids >= 0) & (input_ids < vocab_size)).all())
            return
        if not input_ids.numel():
            return
        lowest, highest = (int(v) for v in torch.aminmax(input_ids))
        if lowest < 0 or highest >= vocab_size:
            bad = input_ids[(input_ids < 0) | (input_ids >= vocab_size)][0].item()
            raise ValueError(f"input_ids contain {bad}, outside the code's vocabulary [0, {vocab_size})")

    def code_bits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Reference: recoded bits ``[..., K]`` of 0/1 (uint8 from the codebook, int64 table-free)."""
        if self.codebook_VK is not None:
            return self.codebook_VK[input_ids]
        bits = input_ids.to(torch.int64).unsqueeze(-1) & self.row_masks_K
        for shift in self._fold_shifts:
            bits = bits ^ (bits >> shift)
        return (bits & 1) ^ self.offset_K

    def bit_values(self, bits: torch.Tensor) -> torch.Tensor:
        """0/1 code bits → activation values: ``scale · bit`` in the output dtype."""
        values = bits.to(self.output_dtype)
        return values * self.code_spec.scale if self.code_spec.scale != 1.0 else values

    def code_words(self, ids: torch.Tensor) -> torch.Tensor:
        """Each id's code in the narrowest integer (bit i = code bit i), ``[N]`` (``ids`` flattened)."""
        flat_ids = ids.reshape(-1).to(torch.int64)
        if self.codebook_VK is not None:
            return self.codebook_words_V.index_select(0, flat_ids)
        tables = self.id_byte_code_words_J256  # [id byte j, its value]; b is folded into table 0
        code = tables[0].index_select(0, flat_ids & 255)
        for j in range(1, tables.shape[0]):
            byte_j = flat_ids >> (8 * j)  # the top byte of a valid (< 2^K) id needs no mask
            code = code ^ tables[j].index_select(0, byte_j & 255 if j + 1 < tables.shape[0] else byte_j)
        return code

    def byte_values(self, device: torch.device) -> torch.Tensor:
        """``bit_values`` of the 8 bits of every byte, ``[256, 8]``: 8 KiB in FP32, made once."""
        key = (device, self.output_dtype)
        if key not in self._byte_values_cache:
            bits = (torch.arange(256, device=device).unsqueeze(-1) >> torch.arange(8, device=device)) & 1
            self._byte_values_cache[key] = self.bit_values(bits)
        return self._byte_values_cache[key]

    def code_values(self, ids: torch.Tensor) -> torch.Tensor:
        """Activation values ``[..., K]`` of each id's code, equal to ``bit_values(code_bits(ids))``:
        gathered byte by byte from ``byte_values``, no per-bit arithmetic. Every table it touches is
        small (a few KiB table-free), so it stays cheap when the caches are cold."""
        code_bytes = self.code_words(ids).view(torch.uint8).to(torch.int64)  # little-endian
        values = self.byte_values(ids.device).index_select(0, code_bytes)
        return values.view(*ids.shape, -1)[..., : self.code_spec.num_bits]

    def lift(self, values_SBK: torch.Tensor) -> torch.Tensor:
        """R: tile the K values along the width, truncating the last tile, into a fresh output
        written once (a broadcast copy; no intermediate of the output's size)."""
        num_bits, hidden = values_SBK.shape[-1], self.config.hidden_size
        num_tiles, rest = divmod(hidden, num_bits)
        x_SBH = torch.empty(*values_SBK.shape[:-1], hidden, dtype=values_SBK.dtype, device=values_SBK.device)
        x_SBH[..., : num_tiles * num_bits].unflatten(-1, (num_tiles, num_bits)).copy_(values_SBK.unsqueeze(-2))
        if rest:
            x_SBH[..., num_tiles * num_bits :] = values_SBK[..., :rest]
        return x_SBH

    def fused_forward(self, input_ids: torch.Tensor, s_begin: int, s_count: int) -> torch.Tensor | None:
        """Positions [s_begin, s_begin + s_count) of ``lift(code_values(ids))`` from the compiled CPU
        kernel (ids checked inside it); None where the torch path must run instead."""
        kernel = fixed_code_cpu_kernel() if self._fused_cpu and input_ids.device.type == "cpu" else None
        if kernel is None:
            if self.kernel == "fused":
                raise RuntimeError(f"kernel='fused' is a CPU kernel for bit codes; got {input_ids.device} ids")
            return None
        if input_ids.dtype != torch.int64 or not input_ids.is_contiguous():
            input_ids = input_ids.to(torch.int64).contiguous()
        x_SBH = torch.empty(s_count, input_ids.shape[0], self.config.hidden_size, dtype=self.output_dtype)
        if self._bit_pair_values is None:  # bit_values of a 0 bit and of a 1 bit
            self._bit_pair_values = self.byte_values(input_ids.device)[:2, 0].contiguous()
        lookup = self.codebook_VK is not None
        if not kernel.fixed_code_lift(
            input_ids,
            s_begin,
            s_count,
            self.code_spec.vocab_size,
            self.codebook_words_V if lookup else self.id_byte_code_words_J256,
            lookup,
            self._bit_pair_values,
            self.code_spec.num_bits,
            x_SBH,
        ):
            self.check_token_ids(input_ids[:, s_begin : s_begin + s_count])  # raises, naming the id
        return x_SBH

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        tokentype_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if tokentype_ids is not None:
            raise ValueError("FixedCodeEmbedding has no token-type embeddings")
        sequence_parallel = self.config.sequence_parallel and self.scatter_to_sequence_parallel
        start, s_local = 0, input_ids.shape[1]
        if sequence_parallel:
            # Each TP rank owns a contiguous 1/tp slice of the sequence: compute only that.
            s_local = input_ids.shape[1] // self.tp_group.size()
            start = self.tp_group.rank() * s_local
        x_SBH = self.fused_forward(input_ids, start, s_local)
        if x_SBH is None:
            self.check_token_ids(input_ids)
            # Codes in the ids' [b, s] order; the lift writes them transposed (no copy of the ids).
            x_SBH = self.lift(self.code_values(input_ids[:, start : start + s_local]).transpose(0, 1))
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
