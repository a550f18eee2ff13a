"""Megatron-LM's flags (``megatron/training/arguments.py`` at core_v0.16.1) that this trainer
accepts besides its core ones, and the ones it refuses as outside its scope.

Three lists, one place each (docs/training.md, "Megatron-LM's command line", shows them):

* :data:`OUT_OF_SCOPE` — flags (and flag prefixes) of model families and features this project
  does not build; each is refused in one line naming the flag, not as "unrecognized".
* :func:`add_accepted_args` — Megatron flags taken with Megatron's name, ``dest`` and default
  whose effect here is either real (noted in the help) or none (:data:`INERT`, logged once).
* The architecture flags and their checks (:func:`architecture_block`): Megatron's defaults
  describe a GPT-2 block (LayerNorm, GELU, biases, learned absolute positions, tied head), built
  as such with the learned input table; a fixed code has no table to tie or to add positions to.
"""
from __future__ import annotations

import argparse
import signal

from megatron_fixedcode.training.megatron_019 import ADDED_AFTER_0_16
from megatron_fixedcode.training.megatron_inert import INERT

# Flag or prefix -> what it belongs to. A prefix ends with "-".
OUT_OF_SCOPE = {
    "--num-experts": "mixture of experts", "--moe-": "mixture of experts",
    "--expert-model-parallel-size": "mixture of experts", "--expert-tensor-parallel-size": "mixture of experts",
    "--mtp-": "multi-token prediction", "--mamba-": "Mamba / hybrid models", "--hybrid-": "Mamba / hybrid models",
    "--is-hybrid-model": "Mamba / hybrid models", "--multi-latent-attention": "multi-latent attention (MLA)",
    "--q-lora-rank": "multi-latent attention (MLA)", "--kv-lora-rank": "multi-latent attention (MLA)",
    "--vision-": "multimodal models", "--img-": "multimodal models", "--patch-dim": "multimodal models",
    "--retro-": "RETRO", "--bert-": "BERT / T5", "--encoder-num-layers": "encoder-decoder models",
    "--decoder-num-layers": "encoder-decoder models", "--heterogeneous-": "heterogeneous layer configs",
    "--fp16": "FP16 training with loss scaling (use --bf16, or --precision fp32-autocast-bf16)",
    "--loss-scale": "FP16 loss scaling", "--initial-loss-scale": "FP16 loss scaling",
    "--min-loss-scale": "FP16 loss scaling", "--loss-scale-window": "FP16 loss scaling",
    "--hysteresis": "FP16 loss scaling", "--fp16-lm-cross-entropy": "FP16 training",
    "--rampup-batch-size": "batch-size ramp-up (the sample stream is indexed by a fixed global batch)",
    "--tiktoken-": "TikTokenizer (give --tokenizer-type HuggingFaceTokenizer --tokenizer-model)",
    "--use-legacy-models": "Megatron-LM's legacy (non-mcore) models",
    "--use-torch-fsdp2": "FSDP", "--use-megatron-fsdp": "FSDP", "--use-custom-fsdp": "FSDP",
    "--hierarchical-context-parallel-sizes": "hierarchical (a2a+p2p) context parallelism",
    "--data-parallel-sharding-strategy": "FSDP", "--first-last-layers-bf16": "per-layer FP8 selection",
    "--fim-": "fill-in-the-middle datasets", "--error-injection-": "Megatron-LM's rerun fault injection",
    "--decoder-first-pipeline-num-layers": "uneven pipeline stages",
    "--decoder-last-pipeline-num-layers": "uneven pipeline stages",
    "--account-for-embedding-in-pipeline-split": "uneven pipeline stages",
    "--account-for-loss-in-pipeline-split": "uneven pipeline stages",
    "--pipeline-model-parallel-layout": "uneven pipeline stages",
    "--use-checkpoint-args": "model flags read from a checkpoint (give them on the command line)",
    '--cpu-offloading-num-layers': 'activation offloading',
    '--qk-l2-norm': 'QK normalization',
    '--qk-clip': 'QK clipping',
    '--qk-clip-alpha': 'QK clipping',
    '--qk-clip-threshold': 'QK clipping',
    '--attention-output-gate': 'gated attention',
    '--experimental-attention-variant': 'experimental attention variants',
    '--dsa-': 'sparse attention',
    '--linear-': 'linear attention',
    '--use-fused-weighted-squared-relu': 'other MLP activations',
    '--fp8-quantizer-factory': 'custom FP8 quantizers',
    '--num-layers-at-start-in-bf16': 'per-layer FP8 selection',
    '--num-layers-at-end-in-bf16': 'per-layer FP8 selection',
    '--use-kitchen-attention': 'kitchen quantization',
    '--fp4-': 'FP4 training',
    '--enable-cuda-graph': 'CUDA graphs',
    '--cuda-graph-': 'CUDA graphs',
    '--external-cuda-graph': 'CUDA graphs',
    '--flash-decode': 'inference serving',
    '--mrope-section': 'multimodal RoPE',
    '--fine-grained-activation-offloading': 'activation offloading',
    '--offload-modules': 'activation offloading',
    '--min-offloaded-tensor-size': 'activation offloading',
    '--window-size': 'sliding-window attention',
    '--window-attn-skip-freq': 'sliding-window attention',
    '--relative-attention-': 'relative position embeddings',
    '--sgd-momentum': 'the SGD optimizer',
    '--muon-': 'the Muon optimizer',
    '--optimizer-cpu-offload': 'optimizer CPU offload',
    '--optimizer-offload-fraction': 'optimizer CPU offload',
    '--use-torch-optimizer-for-cpu-offload': 'optimizer CPU offload',
    '--overlap-cpu-optimizer-d2h-h2d': 'optimizer CPU offload',
    '--perform-rl-step': 'reinforcement learning',
    '--grpo-': 'reinforcement learning',
    '--langrl-': 'reinforcement learning',
    '--refit-method': 'reinforcement learning',
    '--use-mp-args-from-checkpoint-args': 'model flags read from a checkpoint (give them on the command line)',
    '--ckpt-convert-': 'checkpoint format conversion',
    '--no-strict-fsdp-dtensor-load': 'FSDP',
    '--replication': 'non-persistent checkpoint replication', '--replication-': 'non-persistent checkpoint replication',
    '--disable-mamba-mem-eff-path': 'Mamba / hybrid models',
    "--no-rl-": "reinforcement learning", "--no-langrl-": "reinforcement learning", "--no-inference-": "inference serving",
    "--disable-strict-fsdp-dtensor-load": "FSDP",
    '--fsdp-': 'FSDP',
    '--outer-dp-sharding-strategy': 'FSDP',
    '--suggested-communication-unit-size': 'FSDP',
    '--enable-full-sharding-in-hsdp': 'FSDP',
    '--torch-fsdp2-': 'FSDP',
    '--fake-process-group': 'fake process groups',
    '--mask-prob': 'BERT / T5',
    '--short-seq-prob': 'BERT / T5',
    '--ict-': 'BERT / T5',
    '--biencoder-': 'BERT / T5',
    '--titles-data-path': 'BERT / T5',
    '--query-in-block-prob': 'BERT / T5',
    '--use-one-sent-docs': 'BERT / T5',
    '--evidence-data-path': 'BERT / T5',
    '--retriever-': 'BERT / T5',
    '--block-data-path': 'BERT / T5',
    '--embedding-path': 'BERT / T5',
    '--indexer-': 'BERT / T5',
    '--num-classes': 'multimodal models',
    '--num-channels': 'multimodal models',
    '--classes-fraction': 'multimodal models',
    '--data-per-class-fraction': 'multimodal models',
    '--no-data-sharding': 'multimodal models',
    '--head-lr-mult': 'multimodal models',
    '--swin-': 'multimodal models',
    '--mask-type': 'multimodal models',
    '--mask-factor': 'multimodal models',
    '--iter-per-epoch': 'multimodal models',
    '--dino-': 'multimodal models',
    '--qk-clip': 'QK clipping', '--qk-clip-': 'QK clipping',
    '--qk-head-dim': 'multi-latent attention (MLA)', '--qk-pos-emb-head-dim': 'multi-latent attention (MLA)',
    '--v-head-dim': 'multi-latent attention (MLA)',
    '--rotary-scaling-factor': 'multi-latent attention (MLA)',
    '--mscale': 'multi-latent attention (MLA)',
    '--mscale-all-dim': 'multi-latent attention (MLA)',
    '--cache-mla-latents': 'multi-latent attention (MLA)',
    '--max-tokens-to-oom': 'inference serving',
    '--output-bert-embeddings': 'BERT / T5',
    '--use-legacy-static-engine': 'inference serving',
    '--decode-only-cuda-graphs': 'inference serving',
    '--nccl-all-reduce-for-prefill': 'inference serving',
    '--enable-chunked-prefill': 'inference serving',
    '--disable-chunked-prefill': 'inference serving',
    '--mlp-chunks-for-prefill': 'inference serving',
    '--te-precision-config-file': 'per-layer FP8 selection',
    **dict.fromkeys(("--use-precision-aware-optimizer", "--main-grads-dtype", "--main-params-dtype", "--exp-avg-dtype",
                     "--exp-avg-sq-dtype"), "the precision-aware optimizer (FP32 main grads, params and Adam state here)"),
    '--inprocess-': 'in-process restart',
    '--enable-ft-package': 'the fault-tolerance package',
    '--calc-ft-timeouts': 'the fault-tolerance package',
    '--ft-num-warmup-iters': 'the fault-tolerance package',
    '--sft-tokenizer-prompt-format': "Megatron's SFT path (give --dataset-type sft, docs/sft.md)",
    '--overlap-moe-expert-parallel-comm': 'mixture of experts',
    '--ep-overlap-early-attn-memory-release': 'mixture of experts',
    "--non-persistent-": "non-persistent checkpoints",
    "--spec": "custom layer specs", "--yaml-cfg": "Megatron's YAML config (give --config RECIPE.yaml)",
    "--openai-gelu": "other MLP activations", "--quick-geglu": "other MLP activations",
    "--rl-": "reinforcement learning", "--inference-": "inference serving", "--sft": "Megatron's SFT path "
    "(give --dataset-type sft, docs/sft.md)", "--kitchen-": "kitchen quantization",
}
# Megatron-LM's --tokenizer-type values this project does not read -> what they are.
OTHER_TOKENIZERS = {
    "TikTokenizer": "TikToken vocabularies", "BertWordPieceLowerCase": "BERT / T5", "BertWordPieceCase": "BERT / T5",
    "MultimodalTokenizer": "multimodal models", "NullMultimodalTokenizer": "multimodal models",
    "SFTTokenizer": "Megatron's SFT path (give --dataset-type sft, docs/sft.md)",
}
SCOPE_NOTE = "outside this project's scope (dense GPT/Llama pretraining; docs/training.md lists what is refused)"

def _signal(text: str) -> signal.Signals:
    """SIGTERM / TERM / 15 -> signal.SIGTERM (Megatron-LM's parser gives the enum too; JSON prints 15)."""
    try:
        sig = signal.Signals(int(text)) if text.isdigit() else signal.Signals[text if text.startswith("SIG") else "SIG" + text]
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"not a signal: {text!r} (e.g. SIGTERM, SIGUSR1, 15)") from None
    return sig


def out_of_scope(option: str) -> str | None:
    """What ``option`` (a ``--flag`` as typed, ``=value`` allowed) belongs to, if it is refused."""
    flag = option.split("=", 1)[0]
    for key, what in OUT_OF_SCOPE.items():
        if flag == key or (key.endswith("-") and flag.startswith(key)):
            return what
    if flag in ADDED_AFTER_0_16:
        return "a flag Megatron-LM added after core_v0.16.1, whose command line this parser follows"
    return None


def add_accepted_args(p: argparse.ArgumentParser) -> None:
    """Megatron flags besides the core ones: the architecture, LR-by-samples, logging and
    checkpoint extras, and the inert ones (help says so)."""
    g = p.add_argument_group("architecture (Megatron-LM's flags; --block is a shorthand for them)")
    g.add_argument("--normalization", choices=["LayerNorm", "RMSNorm"], default="LayerNorm", help="norm of each block")
    g.add_argument("--swiglu", action="store_true", help="SwiGLU MLP (gated SiLU); GELU MLP without it")
    g.add_argument("--disable-bias-linear", dest="add_bias_linear", action="store_false",
                   help="no biases in the linear layers")
    g.add_argument("--position-embedding-type", choices=["learned_absolute", "rope", "mrope", "relative", "none"],
                   default="learned_absolute", help="position encoding (mrope and relative are not built here)")
    g.add_argument("--use-rotary-position-embeddings", action="store_true",
                   help="Megatron's older spelling of --position-embedding-type rope")
    g.add_argument("--rotary-percent", type=float, default=1.0, help="fraction of each head's dims RoPE rotates")
    g.add_argument("--rotary-interleaved", action="store_true",
                   help="RoPE rotates interleaved pairs of dims instead of the two halves")
    g.add_argument("--untie-embeddings-and-output-weights", action="store_true",
                   help="an output layer of its own (required with a fixed code: it has no table to tie)")
    g.add_argument("--group-query-attention", action="store_true",
                   help="grouped-query attention with --num-query-groups groups (without it, multi-head attention)")
    g.add_argument("--kv-channels", type=int, default=None,
                   help="per-head projection size (default hidden-size / num-attention-heads)")
    g.add_argument("--max-position-embeddings", type=int, default=None,
                   help="longest sequence the positions cover (RoPE: must be >= --seq-length)")
    g.add_argument("--apply-layernorm-1p", dest="layernorm_zero_centered_gamma", action="store_true",
                   help="norm weights stored zero-centred, applied as 1 + w (TE layers only)")
    g.add_argument("--add-qkv-bias", action="store_true", help="biases in the QKV projection only (on with linear biases)")
    g.add_argument("--qk-layernorm", action="store_true", help="normalize queries and keys per head before attention")
    g.add_argument("--squared-relu", action="store_true", help="squared-ReLU MLP instead of GELU (not with --swiglu)")
    g.add_argument("--use-rope-scaling", action="store_true", help="Llama-3.x RoPE frequency scaling")
    g.add_argument("--rope-scaling-factor", type=float, default=8.0, help="factor of --use-rope-scaling")
    g.add_argument("--attention-dropout", type=float, default=0.1, help="dropout on the attention probabilities")
    g.add_argument("--hidden-dropout", type=float, default=0.1, help="dropout on the block outputs (residual adds)")
    g.add_argument("--attention-backend", choices=["flash", "fused", "unfused", "local", "auto"], default="auto",
                   help="accepted; " + INERT["attention_backend"])
    g = p.add_argument_group("schedule by samples (Megatron-LM)")
    g.add_argument("--train-samples", type=int, default=None,
                   help="train for this many samples (steps = samples // global batch); excludes --train-iters")
    g.add_argument("--lr-warmup-samples", type=int, default=0, help="LR warmup in samples (with --train-samples)")
    g.add_argument("--lr-decay-samples", type=int, default=None,
                   help="LR decay in samples (with --train-samples; default: --train-samples)")
    g.add_argument("--lr-warmup-fraction", type=float, default=None,
                   help="LR warmup as a fraction of the decay steps; excludes --lr-warmup-iters/-samples")
    g.add_argument("--lr-warmup-init", type=float, default=0.0, help="LR at the start of warmup")
    g = p.add_argument_group("runtime, logging and checkpoint extras (Megatron-LM)")
    g.add_argument("--manual-gc", action="store_true", help="disable Python's automatic GC; collect every --manual-gc-interval steps")
    g.add_argument("--manual-gc-interval", type=int, default=0, help="steps between collections under --manual-gc (0: never)")
    g.add_argument("--empty-unused-memory-level", type=int, choices=[0, 1, 2], default=0,
                   help="CUDA: release cached memory after each step (1, 2); no effect on CPU")
    g.add_argument("--no-mmap-bin-files", dest="mmap_bin_files", action="store_false",
                   help="read the .bin shards with file reads instead of mmap")
    g.add_argument("--padded-vocab-size", type=int, default=None,
                   help="output-layer rows as given (at least the vocabulary, a multiple of TP) instead of "
                        "--make-vocab-size-divisible-by's padding")
    g.add_argument("--mock-data", action="store_true",
                   help="megatron-core's MockGPTDataset instead of data (token ramps; split 1,1,1): throughput and "
                        "smoke runs; the only data source, with a tokenizer or --vocab-size")
    g.add_argument("--tensorboard-log-interval", type=int, default=1, help="steps between TensorBoard scalars")
    g.add_argument("--wandb-exp-name", default=None, help="W&B run name (the run id is kept with the checkpoint)")
    g.add_argument("--save-retain-interval", type=int, default=None,
                   help="keep only checkpoints whose step is a multiple of N, and the newest (default: keep all)")
    g.add_argument("--no-load-optim", action="store_true", default=None,
                   help="resume without the optimizer's state (Adam moments start fresh)")
    g.add_argument("--no-load-rng", action="store_true", default=None, help="resume without the saved RNG states")
    g.add_argument("--exit-signal", type=_signal, default=signal.SIGTERM,
                   help="the signal --exit-signal-handler catches (e.g. SIGUSR1 for Slurm's --signal=B:USR1@300)")


POSITION_EMBEDDINGS = ("learned_absolute", "rope", "none")  # GPTModel's, built here

# --block NAME: the project's shorthand for Megatron's architecture flags.
BLOCK_FLAGS = {
    "llama": {"normalization": "RMSNorm", "swiglu": True, "add_bias_linear": False, "position_embedding_type": "rope",
              "untie_embeddings_and_output_weights": True},
    "gpt_gelu": {"normalization": "LayerNorm", "swiglu": False, "add_bias_linear": False,
                 "position_embedding_type": "rope", "untie_embeddings_and_output_weights": True},
}


class BlockAction(argparse.Action):
    """``--block llama`` = --normalization RMSNorm --swiglu --disable-bias-linear
    --position-embedding-type rope --untie-embeddings-and-output-weights (gpt_gelu: LayerNorm, no --swiglu)."""

    def __call__(self, parser, namespace, values, option_string=None):
        for dest, value in BLOCK_FLAGS[values].items():
            setattr(namespace, dest, value)


def expand_block_key(values: dict) -> None:
    """A recipe's ``block:`` key: its Megatron flags become defaults unless the recipe names them."""
    name = values.pop("block", None)
    if name is None:
        return
    if name not in BLOCK_FLAGS:
        raise ValueError(f"block must be one of {sorted(BLOCK_FLAGS)}, got {name!r}")
    for dest, value in BLOCK_FLAGS[name].items():
        values.setdefault(dest, value)


def architecture_block(a: argparse.Namespace) -> str:
    """The block (``models.config.BLOCKS``) of Megatron's --normalization and --swiglu; ValueError
    (one line) for what is not built here: a fixed code tied to the head or next to a learned
    position table, and position encodings other than RoPE, learned absolute or none."""
    if a.use_rotary_position_embeddings:
        a.position_embedding_type = "rope"
    if not a.add_position_embedding and a.position_embedding_type != "rope":  # as Megatron-LM's validate_args
        raise ValueError("--no-position-embedding is deprecated (Megatron-LM refuses it too without RoPE): "
                         "give --position-embedding-type none")
    if a.position_embedding_type not in POSITION_EMBEDDINGS:
        raise ValueError(f"--position-embedding-type {a.position_embedding_type} is not built here: give one of "
                         f"{', '.join(POSITION_EMBEDDINGS)}")
    if a.input_embedding != "learned":
        if not a.untie_embeddings_and_output_weights:
            raise ValueError(f"--input-embedding {a.input_embedding} has no table to tie the output layer to: give "
                             "--untie-embeddings-and-output-weights (Megatron-LM's default ties them), or --block llama")
        if a.position_embedding_type == "learned_absolute":
            raise ValueError(f"--input-embedding {a.input_embedding} with --position-embedding-type learned_absolute "
                             "would add a trained table next to the fixed code: give rope or none, or --block llama")
    return {("RMSNorm", True): "llama", ("LayerNorm", False): "gpt_gelu", ("LayerNorm", True): "layernorm_swiglu",
            ("RMSNorm", False): "rmsnorm_gelu"}[(a.normalization, bool(a.swiglu))]
