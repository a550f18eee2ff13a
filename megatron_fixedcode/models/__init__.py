"""Models: the fixed-code input interface inside megatron-core's GPTModel."""
from megatron_fixedcode.models.builder import build_gpt_model, build_transformer_config
from megatron_fixedcode.models.config import INPUT_EMBEDDINGS, ModelConfig
from megatron_fixedcode.models.fixed_code_embedding import FixedCodeEmbedding
from megatron_fixedcode.models.gpt import InputInterfaceGPTModel
from megatron_fixedcode.models.report import format_parameter_report, parameter_report

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
