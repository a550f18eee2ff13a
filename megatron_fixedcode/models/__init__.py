"""Models: the fixed-code input interface inside megatron-core's GPTModel."""

from megatron_fixedcode.utils.lazy import lazy_exports

_EXPORTS = {
    "build_gpt_model": "builder",
    "build_transformer_config": "builder",
    "INPUT_EMBEDDINGS": "config",
    "ModelConfig": "config",
    "FixedCodeEmbedding": "fixed_code_embedding",
    "InputInterfaceGPTModel": "gpt",
    "format_parameter_report": "cost",
    "parameter_report": "cost",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "INPUT_EMBEDDINGS",
    "FixedCodeEmbedding",
    "InputInterfaceGPTModel",
    "ModelConfig",
    "build_gpt_model",
    "build_transformer_config",
    "format_parameter_report",
    "parameter_report",
]
