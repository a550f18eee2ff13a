"""`ModelConfig`: the architecture and input interface of one model, as plain data."""

from __future__ import annotations

import dataclasses

import numpy as np

from megatron_fixedcode.codes import CODE_FAMILIES, CODE_IMPLEMENTATIONS, CODE_KINDS, PAPER_CODE_SEED, CodeSpec

INPUT_EMBEDDINGS = ("learned", *CODE_KINDS)
CODE_KERNELS = ("auto", "fused", "torch")  # FixedCodeEmbedding's forward on CPU
BLOCKS = {
    # Paper 2 (1.7B): RMSNorm, SwiGLU, RoPE, no biases.
    "llama": {"normalization": "RMSNorm", "gated_linear_unit": True, "activation": "silu"},
    # The paper-1 recipes (0.4B): GELU MLP and RoPE (paper 1's); LayerNorm with a bias and no linear
    # biases are ours, paper 1 names no norm (megatron's LayerNorm has weight and bias; add_bias_linear=False).
    "gpt_gelu": {"normalization": "LayerNorm", "gated_linear_unit": False, "activation": "gelu"},
    # The other two combinations of Megatron-LM's --normalization and --swiglu (e.g. its Llama-3
    # example: LayerNorm + SwiGLU). Trained like the two above; no Hugging Face export maps them.
    "layernorm_swiglu": {"normalization": "LayerNorm", "gated_linear_unit": True, "activation": "silu"},
    "rmsnorm_gelu": {"normalization": "RMSNorm", "gated_linear_unit": False, "activation": "gelu"},
}
GELU_APPROXIMATIONS = ("none", "tanh")  # F.gelu's approximate=: erf, or megatron's fused bias-GELU kernel
POSITION_EMBEDDINGS = ("learned_absolute", "rope", "none")  # GPTModel's position_embedding_type, built here
MATRIX_CODE = "gf2"  # the one code family whose matrix A a file may give (code_matrix, --code-matrix)
# Why a fixed code cannot go with a choice (:func:`fixed_code_conflict`): it has no table.
NO_TABLE_TO_TIE = "has no table to tie the output layer to"
NO_TABLE_FOR_POSITIONS = "would add a trained table next to the fixed code"
TRANSFORMER_IMPLS = ("auto", "local", "transformer_engine")
FP8_FORMATS = ("e4m3", "hybrid")  # TransformerConfig.fp8
FP8_RECIPES = ("delayed", "tensorwise", "mxfp8", "blockwise")  # TransformerConfig.fp8_recipe


def block_of(normalization: str, gated_linear_unit: bool) -> str:
    """The :data:`BLOCKS` name of Megatron-LM's --normalization and --swiglu."""
    return next(
        name
        for name, b in BLOCKS.items()
        if (b["normalization"], b["gated_linear_unit"]) == (normalization, gated_linear_unit)
    )


def fixed_code_conflict(input_embedding: str, *, tied: bool, position_embedding_type: str) -> str | None:
    """Why ``input_embedding`` cannot have a tied output layer or learned absolute positions (None: it can):
    a fixed code has no table to tie, nor one beside which a trained position table belongs."""
    if input_embedding == "learned":
        return None
    if tied:
        return NO_TABLE_TO_TIE
    return NO_TABLE_FOR_POSITIONS if position_embedding_type == "learned_absolute" else None


def fp8_needs(fp8: str | None, *, bf16: bool, transformer_impl: str) -> str | None:
    """What FP8 GEMMs lack (None: nothing): ``"transformer_engine"`` (they run in TE layers only) or
    ``"bf16"`` (BF16 everywhere else)."""
    if not fp8:
        return None
    if transformer_impl == "local":
        return "transformer_engine"
    return None if bf16 else "bf16"


@dataclasses.dataclass(kw_only=True)
class ModelConfig:
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    seq_length: int
    vocab_size: int  # the tokenizer's true vocabulary; the output layer is padded, the code is not
    num_query_groups: int | None = None
    block: str = "llama"
    make_vocab_size_divisible_by: int = 128
    padded_vocab: int | None = None  # Megatron-LM's --padded-vocab-size: the output rows as given
    norm_epsilon: float = 1e-5
    rotary_base: int = 10000
    # Megatron-LM's --kv-channels (per-head width; None: hidden / heads) and --rotary-percent (the
    # fraction of each head's dims RoPE rotates): TransformerConfig.kv_channels, GPTModel.rotary_percent
    kv_channels: int | None = None
    rotary_percent: float = 1.0
    rotary_interleaved: bool = False  # --rotary-interleaved: TransformerConfig.rotary_interleaved
    # Megatron-LM's GPT-2 block (its defaults), built with the learned table only: linear biases,
    # learned absolute positions (a table of max_position_embeddings rows, default seq_length) and
    # the output layer tied to the input table.
    add_bias_linear: bool = False
    position_embedding_type: str = "rope"  # "rope" | "learned_absolute" | "none"
    max_position_embeddings: int | None = None
    share_embeddings_and_output_weights: bool = False
    # more of Megatron-LM's architecture flags (TransformerConfig / GPTModel fields of these names)
    add_qkv_bias: bool = False  # on whenever add_bias_linear is
    qk_layernorm: bool = False
    squared_relu: bool = False  # the MLP's activation instead of the block's GELU
    # "tanh": the GELU MLP computed GELU's tanh approximation (megatron's fused bias-GELU kernel, on by
    # default on GPUs); "none": erf (F.gelu). Recorded so that CPU evaluation and the export compute it too.
    gelu_approximation: str = "none"
    rope_scaling: bool = False  # Llama-3.x frequency scaling (--use-rope-scaling)
    rope_scaling_factor: float = 8.0
    init_method_std: float = 0.02
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    input_embedding: str = "binary"
    code_seed: int = PAPER_CODE_SEED
    # gf2: an explicit A (K rows of K 0/1 ints, `--code-matrix FILE`) instead of the one drawn for
    # code_seed; stored in checkpoints so export and evaluation rebuild exactly this map.
    code_matrix: tuple[tuple[int, ...], ...] | None = None
    code_offset: int = 0
    code_impl: str = "table_free"
    code_kernel: str = "auto"  # bit codes on CPU: "auto" | "fused" (compiled one-pass kernel) | "torch"
    code_scale: float = 1.0
    code_bits: int | None = None
    code_min_weight: int = 4
    code_width: int | None = None  # K′ of random / sinusoidal / lowdim (default ceil(log2 V))
    code_centered: bool = False  # binary / gf2: ±1 (2c − 1) instead of 0/1
    code_norm_match: bool = False  # scale the code so its input RMS equals init_method_std (the learned table's)
    code_base: float | None = None  # sinusoidal: ω_i = base^(-2i/K′), default 10000
    transformer_impl: str = "auto"
    bf16: bool = False  # megatron's BF16 mode: BF16 weights and activations, FP32 master weights in the optimizer
    # paper 2's mode (--precision fp32-autocast-bf16): FP32 parameters, residual stream and norms,
    # matmuls under torch.autocast(bfloat16)
    autocast_bf16: bool = False
    recompute_granularity: str | None = None
    recompute_method: str | None = None  # full recompute: uniform | block (megatron's TransformerConfig)
    recompute_num_layers: int | None = None
    layernorm_zero_centered_gamma: bool = False  # --apply-layernorm-1p (TE norms)
    # FP8 GEMMs in the TE layers (megatron TransformerConfig fields of the same names). The input
    # interface is unaffected: it emits the activation dtype (bf16) and TE quantizes what it consumes.
    fp8: str | None = None
    fp8_recipe: str = "delayed"
    fp8_amax_history_len: int = 1
    fp8_amax_compute_algo: str = "most_recent"
    fp8_param: bool = False

    def __post_init__(self):
        for name in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "seq_length", "vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.padded_vocab is not None and self.padded_vocab < self.vocab_size:
            raise ValueError(
                f"--padded-vocab-size {self.padded_vocab} is smaller than the vocabulary ({self.vocab_size}): "
                "the output layer needs a row per token"
            )
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads={self.num_attention_heads}"
            )
        if self.gelu_approximation not in GELU_APPROXIMATIONS:
            raise ValueError(
                f"gelu_approximation must be one of {GELU_APPROXIMATIONS}, got {self.gelu_approximation!r}"
            )
        if self.block not in BLOCKS:
            raise ValueError(f"block must be one of {sorted(BLOCKS)}, got {self.block!r}")
        if self.input_embedding not in INPUT_EMBEDDINGS:
            raise ValueError(f"input_embedding must be one of {INPUT_EMBEDDINGS}, got {self.input_embedding!r}")
        if self.position_embedding_type not in POSITION_EMBEDDINGS:
            raise ValueError(
                f"position_embedding_type must be one of {POSITION_EMBEDDINGS}, got {self.position_embedding_type!r}"
            )
        why = fixed_code_conflict(
            self.input_embedding,
            tied=self.share_embeddings_and_output_weights,
            position_embedding_type=self.position_embedding_type,
        )
        if why:
            field = "share_embeddings_and_output_weights" if why == NO_TABLE_TO_TIE else "position_embedding_type"
            raise ValueError(f"{field}: input_embedding {self.input_embedding!r} {why}")
        if self.squared_relu and BLOCKS[self.block]["gated_linear_unit"]:
            raise ValueError("squared_relu replaces the GELU MLP: not with a SwiGLU block")
        if self.code_kernel not in CODE_KERNELS:
            raise ValueError(f"code_kernel must be one of {CODE_KERNELS}, got {self.code_kernel!r}")
        if self.code_impl not in CODE_IMPLEMENTATIONS:
            raise ValueError(f"code_impl must be one of {CODE_IMPLEMENTATIONS}, got {self.code_impl!r}")
        if self.transformer_impl not in TRANSFORMER_IMPLS:
            raise ValueError(f"transformer_impl must be one of {TRANSFORMER_IMPLS}, got {self.transformer_impl!r}")
        if self.recompute_granularity not in (None, "full", "selective"):
            raise ValueError(
                f"recompute_granularity must be full, selective or None, got {self.recompute_granularity!r}"
            )
        if self.fp8 not in (None, *FP8_FORMATS):
            raise ValueError(f"fp8 must be one of {FP8_FORMATS} or None, got {self.fp8!r}")
        if self.fp8_recipe not in FP8_RECIPES:
            raise ValueError(f"fp8_recipe must be one of {FP8_RECIPES}, got {self.fp8_recipe!r}")
        if self.fp8_amax_history_len < 1:
            raise ValueError(f"fp8_amax_history_len must be >= 1, got {self.fp8_amax_history_len}")
        if self.fp8_amax_compute_algo not in ("most_recent", "max"):
            raise ValueError(f"fp8_amax_compute_algo must be most_recent or max, got {self.fp8_amax_compute_algo!r}")
        if fp8_needs(self.fp8, bf16=self.bf16, transformer_impl=self.transformer_impl):
            raise ValueError(
                "fp8 needs bf16=True and Transformer Engine layers (transformer_impl auto or transformer_engine)"
            )
        if self.bf16 and self.autocast_bf16:
            raise ValueError(
                "bf16 (BF16 weights) and autocast_bf16 (FP32 weights under BF16 autocast) exclude each other"
            )
        if self.fp8_param and not self.fp8:
            raise ValueError("fp8_param needs fp8")
        if self.code_matrix is not None:
            self.code_matrix = tuple(tuple(int(v) for v in row) for row in self.code_matrix)  # JSON gives lists
            if self.input_embedding != MATRIX_CODE:
                raise ValueError(
                    f"code_matrix is the GF(2) recoding matrix: it needs input_embedding {MATRIX_CODE}, "
                    f"not {self.input_embedding!r}"
                )
        self.code_spec()  # validates V vs K, d >= K, seeds

    def code_spec(self) -> CodeSpec | None:
        """The input code of this model, or None for the learned table.

        ``code_norm_match``: scale = init_method_std / RMS of the unscaled code, so the inputs have
        the learned table's RMS at init (row norm ≈ init_std·sqrt(d)). ``lowdim``: its coordinates
        start as a unit Gaussian table times init_method_std·code_scale (a learned table's init)."""
        if self.input_embedding == "learned":
            return None
        family = CODE_FAMILIES[self.input_embedding]
        if self.code_width is not None and family.bits:
            raise ValueError(f"code_width is for random/sinusoidal/lowdim; {self.input_embedding} takes code_bits")
        if self.code_bits is not None and not family.bits:
            raise ValueError(f"code_bits is for binary/gf2; {self.input_embedding} takes code_width")
        if self.code_norm_match and self.code_scale != 1.0:
            raise ValueError(f"code_norm_match computes the scale: drop code_scale={self.code_scale}")
        if self.code_norm_match and family.trainable:
            raise ValueError("code_norm_match: lowdim is initialized at the learned table's std already")
        scale = self.code_scale * (self.init_method_std if family.trainable else 1.0)
        fields = dict(
            kind=self.input_embedding,
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            code_bits=self.code_bits if family.bits else self.code_width,
            seed=self.code_seed,
            matrix=None if self.code_matrix is None else np.asarray(self.code_matrix, dtype=np.uint8),
            min_weight=self.code_min_weight,
            offset=self.code_offset,
            implementation=self.code_impl,
            centered=self.code_centered,
            base=self.code_base,
            # under autocast the first matmul reads the code rounded to BF16: check injectivity there
            dtype="bfloat16" if self.bf16 or self.autocast_bf16 else "float32",
        )
        if self.code_norm_match:
            scale = self.init_method_std / CodeSpec.create(**fields, scale=1.0).input_rms()
        return CodeSpec.create(**fields, scale=scale)

    def padded_vocab_size(self, tensor_model_parallel_size: int = 1) -> int:
        return padded_vocab_size(
            self.vocab_size, self.make_vocab_size_divisible_by, tensor_model_parallel_size, self.padded_vocab
        )


def padded_vocab_size(
    vocab_size: int, divisible_by: int, tensor_model_parallel_size: int = 1, padded: int | None = None
) -> int:
    """Output-layer rows as Megatron-LM sets them: --padded-vocab-size as given, else the vocabulary
    rounded up to a multiple of --make-vocab-size-divisible-by × TP."""
    if padded is not None:
        return padded
    multiple = divisible_by * tensor_model_parallel_size
    return -(-vocab_size // multiple) * multiple
