"""`InputInterfaceGPTModel`: megatron-core's GPTModel with a chosen input interface.

GPTModel builds `LanguageModelEmbedding` itself and has no slot for another embedding, so this
subclass substitutes the class GPTModel looks up while its constructor runs. Nothing of
gpt_model.py is copied; the fixed code never allocates a V×h table.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch
from megatron.core.models.common.embeddings.language_model_embedding import LanguageModelEmbedding
from megatron.core.models.gpt import gpt_model as gpt_model_module
from megatron.core.models.gpt.gpt_model import GPTModel

from megatron_fixedcode.compat.rng import rng_detour


@contextlib.contextmanager
def _embedding_class(factory: Callable[..., torch.nn.Module]):
    """While GPTModel.__init__ runs, `LanguageModelEmbedding(...)` calls ``factory``."""
    original = gpt_model_module.LanguageModelEmbedding
    gpt_model_module.LanguageModelEmbedding = factory
    try:
        yield
    finally:
        gpt_model_module.LanguageModelEmbedding = original


def learned_embedding(**kwargs) -> LanguageModelEmbedding:
    """The learned table, initialized on a detoured RNG so the backbone init is unchanged."""
    with rng_detour():
        return LanguageModelEmbedding(**kwargs)


class InputInterfaceGPTModel(GPTModel):
    """GPTModel whose input embedding is built by ``embedding_factory`` (same kwargs as
    LanguageModelEmbedding). The output head is always untied and trainable."""

    def __init__(self, *, embedding_factory: Callable[..., torch.nn.Module] = learned_embedding, **gpt_kwargs):
        if gpt_kwargs.get("share_embeddings_and_output_weights", False):
            raise ValueError("share_embeddings_and_output_weights must be False: a fixed code cannot be tied to the head")
        if gpt_kwargs.get("mtp_block_spec") is not None:
            raise ValueError("multi-token prediction is not supported (it re-embeds with the input table)")
        with _embedding_class(embedding_factory):
            super().__init__(**gpt_kwargs)

    @property
    def has_input_table(self) -> bool:
        return hasattr(self, "embedding") and hasattr(self.embedding, "word_embeddings")

    def setup_embeddings_and_output_layer(self) -> None:
        if self.has_input_table:
            return super().setup_embeddings_and_output_layer()
        if self.post_process and self.output_layer.weight is not None:
            self.output_layer.weight.is_embedding_or_output_parameter = True

    def shared_embedding_or_output_weight(self) -> torch.Tensor | None:
        if self.has_input_table:
            return super().shared_embedding_or_output_weight()
        return self.output_layer.weight if self.post_process else None
