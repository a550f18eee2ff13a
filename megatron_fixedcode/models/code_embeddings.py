"""Input interfaces beyond the 0/1 bit code, on `FixedCodeEmbedding`'s forward (id check, sequence-
parallel slicing, recompute, dropout, code identity in the checkpoint):

* `CenteredBitCodeEmbedding` — binary/gf2 as ±1: x = scale · R · (2c~ − 1), both implementations;
* `FloatCodeEmbedding` — random/sinusoidal: a frozen float32 V×K′ buffer ``fl32(scale·T)``,
  gathered, cast to the activation dtype and tiled (lookup only);
* `LowDimCodeEmbedding` — lowdim: the same, but the V×K′ table is a trainable parameter.

Shape legend: B batch, S sequence, V vocabulary, K code width, H hidden size.

The lowdim parameter is replicated over tensor-parallel ranks (no ``tensor_model_parallel``
attribute: megatron checkpoints it as a replica, DDP all-reduces its gradient over data-parallel
ranks); under sequence parallelism each TP rank sees only its positions, so it is tagged
``sequence_parallel`` and ``finalize_model_grads`` sums its gradient over the TP group.
"""

from __future__ import annotations

import torch
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron_fixedcode.codes import CodeSpec
from megatron_fixedcode.models.fixed_code_embedding import FixedCodeEmbedding


def tile(x_SBK: torch.Tensor, hidden_size: int) -> torch.Tensor:
    """R: repeat the K coordinates along the width, truncating the last tile."""
    num_repeats = -(-hidden_size // x_SBK.shape[-1])
    return x_SBK.repeat(*([1] * (x_SBK.dim() - 1)), num_repeats)[..., :hidden_size].contiguous()


class CenteredBitCodeEmbedding(FixedCodeEmbedding):
    """The bit code mapped to ±1 before the lift; table-free and lookup stay bit-identical."""

    def bit_values(self, bits: torch.Tensor) -> torch.Tensor:
        return super().bit_values(2 * bits.to(torch.int8) - 1)


class FloatCodeEmbedding(FixedCodeEmbedding):
    """A float code table; the scale is already in the table (so the values are exactly those the
    spec checked for collisions at the activation dtype)."""

    def __init__(self, config: TransformerConfig, code_spec: CodeSpec, **kwargs):
        if code_spec.family.bits:
            raise ValueError(f"{type(self).__name__} takes a float code, got kind={code_spec.kind!r}")
        super().__init__(config, code_spec, **kwargs)
        self._register_table(torch.from_numpy(code_spec.input_table()))

    def _register_table(self, table_VK: torch.Tensor) -> None:
        self.register_buffer("table_VK", table_VK, persistent=True)

    def code_bits(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.table_VK[input_ids]

    def code_values(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.table_VK[input_ids].to(self.output_dtype)

    def lift(self, values_SBK: torch.Tensor) -> torch.Tensor:
        return tile(values_SBK, self.config.hidden_size)


class LowDimCodeEmbedding(FloatCodeEmbedding):
    """Learned K-dimensional coordinates per token (V×K trainable), the same fixed lift."""

    def _register_table(self, table_VK: torch.Tensor) -> None:
        weight = torch.nn.Parameter(table_VK.to(self.config.params_dtype))
        weight.tensor_model_parallel = False
        weight.sequence_parallel = self.config.sequence_parallel
        self.table_VK = weight


def embedding_class(code_spec: CodeSpec) -> type[FixedCodeEmbedding]:
    """The module that emits ``code_spec``'s inputs (by family properties, not by name)."""
    if code_spec.family.trainable:
        return LowDimCodeEmbedding
    if not code_spec.family.bits:
        return FloatCodeEmbedding
    return CenteredBitCodeEmbedding if code_spec.centered else FixedCodeEmbedding
