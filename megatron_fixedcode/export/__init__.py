"""Hugging Face export and import: megatron checkpoints ⇄ ``LlamaForCausalLM`` / ``GPTNeoXForCausalLM``."""
from megatron_fixedcode.export.from_hf import convert_hf_to_megatron
from megatron_fixedcode.export.megatron_io import LoadedCheckpoint, load_megatron_checkpoint, megatron_logits
from megatron_fixedcode.export.to_hf import convert_checkpoint_to_hf, write_hf_model

__all__ = [
    "LoadedCheckpoint",
    "convert_checkpoint_to_hf",
    "convert_hf_to_megatron",
    "load_megatron_checkpoint",
    "megatron_logits",
    "write_hf_model",
]
