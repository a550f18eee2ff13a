"""`InputInterfaceGPTModel`: megatron-core's GPTModel with a chosen input interface.

GPTModel builds `LanguageModelEmbedding` itself and has no slot for another embedding, so this
subclass substitutes the class GPTModel looks up while its constructor runs. Nothing of
gpt_model.py is copied; the fixed code never allocates a V×h table.

Each transformer layer initialises from a seed of its global layer number
(:func:`compat.rng.layer_init_seed`), so the same layer starts from the same weights whichever
pipeline stage builds it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable

import torch
from megatron.core.models.common.embeddings.language_model_embedding import LanguageModelEmbedding
from megatron.core.models.gpt import gpt_model as gpt_model_module
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

from megatron_fixedcode.compat.rng import layer_init_seed, rng_detour, seeded_streams


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


def _global_layer_number(config, layer_number: int, kwargs: dict) -> int:
    """The 1-based global number TransformerLayer.__init__ gives itself (same rule, both versions)."""
    if kwargs.get("is_mtp_layer") or not kwargs.get("add_layer_offset", True):
        return layer_number
    if kwargs.get("pp_layer_offset") is not None:  # megatron-core >= 0.19
        return layer_number + kwargs["pp_layer_offset"]
    pg_collection = kwargs.get("pg_collection") or ProcessGroupCollection.use_mpu_process_groups()
    return layer_number + get_transformer_layer_offset(config, kwargs.get("vp_stage"), pg_collection.pp.rank())


def with_layout_independent_init(layer_spec: ModuleSpec, seed: int) -> ModuleSpec:
    """``layer_spec`` whose layer builds itself on streams seeded by (seed, global layer number)."""
    layer_cls = layer_spec.module
    if not isinstance(layer_spec, ModuleSpec) or not isinstance(layer_cls, type):
        raise TypeError(f"expected a transformer layer ModuleSpec with a class, got {layer_spec!r}")

    class SeededInitLayer(layer_cls):
        def __init__(self, config, submodules, layer_number: int = 1, *args, **kwargs):
            number = _global_layer_number(config, layer_number, kwargs)
            with seeded_streams(layer_init_seed(seed, number)):
                super().__init__(config, submodules, layer_number, *args, **kwargs)

    SeededInitLayer.__name__ = SeededInitLayer.__qualname__ = layer_cls.__name__
    return dataclasses.replace(layer_spec, module=SeededInitLayer)


class InputInterfaceGPTModel(GPTModel):
    """GPTModel whose input embedding is built by ``embedding_factory`` (same kwargs as
    LanguageModelEmbedding). With a fixed code the output layer is untied and trainable; the learned
    table may be tied to it (Megatron-LM's default)."""

    def __init__(
        self,
        *,
        embedding_factory: Callable[..., torch.nn.Module] = learned_embedding,
        init_seed: int | None = None,
        **gpt_kwargs,
    ):
        """``init_seed`` (default: torch's current seed) seeds each layer's init by its global number."""
        gpt_kwargs["transformer_layer_spec"] = with_layout_independent_init(
            gpt_kwargs["transformer_layer_spec"], torch.initial_seed() if init_seed is None else init_seed
        )
        if gpt_kwargs.get("share_embeddings_and_output_weights", False) and embedding_factory is not learned_embedding:
            raise ValueError(
                "share_embeddings_and_output_weights must be False: a fixed code cannot be tied to the head"
            )
        if gpt_kwargs.get("mtp_block_spec") is not None:
            raise ValueError("multi-token prediction is not supported (it re-embeds with the input table)")
        # read by GPTModel.__init__ (setup_embeddings_and_output_layer) on every stage, also those
        # that build no embedding: a plain attribute, set before nn.Module.__init__
        object.__setattr__(self, "_learned_table", embedding_factory is learned_embedding)
        with _embedding_class(embedding_factory):
            super().__init__(**gpt_kwargs)

    @property
    def has_input_table(self) -> bool:
        """The model's input is megatron's learned table (on its first stage; a tied head's copy on the last)."""
        return self._learned_table

    def setup_embeddings_and_output_layer(self) -> None:
        if self.has_input_table:
            return super().setup_embeddings_and_output_layer()
        if self.post_process and self.output_layer.weight is not None:
            self.output_layer.weight.is_embedding_or_output_parameter = True

    def shared_embedding_or_output_weight(self) -> torch.Tensor | None:
        if self.has_input_table:
            return super().shared_embedding_or_output_weight()
        return self.output_layer.weight if self.post_process else None
