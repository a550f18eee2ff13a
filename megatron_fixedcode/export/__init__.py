"""Hugging Face export and import: megatron checkpoints ⇄ ``LlamaForCausalLM`` / ``GPTNeoXForCausalLM``."""

from megatron_fixedcode._lazy import lazy_exports

_EXPORTS = {
    "convert_hf_to_megatron": "from_hf",
    "LoadedCheckpoint": "megatron_io",
    "load_megatron_checkpoint": "megatron_io",
    "megatron_logits": "megatron_io",
    "convert_checkpoint_to_hf": "to_hf",
    "write_hf_model": "to_hf",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "LoadedCheckpoint",
    "convert_checkpoint_to_hf",
    "convert_hf_to_megatron",
    "load_megatron_checkpoint",
    "megatron_logits",
    "write_hf_model",
]
