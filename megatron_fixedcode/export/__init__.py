"""Hugging Face export and import: megatron checkpoints ⇄ ``LlamaForCausalLM`` / ``GPTNeoXForCausalLM``.

A checkpoint in one process (load, save, logits) is :mod:`megatron_fixedcode.checkpoint.single_process`."""

from megatron_fixedcode.utils.lazy import lazy_exports

_EXPORTS = {
    "convert_hf_to_megatron": "from_hf",
    "convert_checkpoint_to_hf": "to_hf",
    "write_hf_model": "to_hf",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "convert_checkpoint_to_hf",
    "convert_hf_to_megatron",
    "write_hf_model",
]
