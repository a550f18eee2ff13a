"""Megatron-LM's flags (``megatron/training/arguments.py`` at core_v0.16.1) that this trainer
accepts besides its core ones, and the ones it refuses as outside its scope.

Three lists, one place each (docs/training.md, "Megatron-LM's command line", shows them):

* :data:`OUT_OF_SCOPE` — flags (and flag prefixes) of model families and features this project
  does not build; each is refused in one line naming the flag, not as "unrecognized".
* :func:`add_accepted_args` — Megatron flags taken with Megatron's name, ``dest`` and default
  whose effect here is either real (noted in the help) or none (:data:`INERT`, logged once).
* The architecture flags and their checks (:func:`architecture_block`): Megatron's defaults
  describe a GPT-2 block (LayerNorm, GELU, biases, learned absolute positions, tied head); this
  project builds bias-free RoPE blocks with an untied head, so the other values are refused.
"""
from __future__ import annotations

import argparse
import signal

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
    "--decoupled-lr": "a separate learning rate for the input/output layers",
    "--decoupled-min-lr": "a separate learning rate for the input/output layers",
    "--mock-data": "mock data (give --data-path; tests/data_helpers.py writes tiny corpora)",
    "--vocab-file": "GPT2BPETokenizer / BERT vocab files (give --tokenizer-type HuggingFaceTokenizer --tokenizer-model)",
    "--merge-file": "GPT2BPETokenizer (give --tokenizer-type HuggingFaceTokenizer --tokenizer-model)",
    "--tiktoken-": "TikTokenizer (give --tokenizer-type HuggingFaceTokenizer --tokenizer-model)",
    "--use-legacy-models": "Megatron-LM's legacy (non-mcore) models",
    "--use-torch-fsdp2": "FSDP", "--use-megatron-fsdp": "FSDP", "--use-custom-fsdp": "FSDP",
    "--num-layers-per-virtual-pipeline-stage": "Megatron's virtual-pipeline flags (give "
                                              "--virtual-pipeline-model-parallel-size)",
    "--num-virtual-stages-per-pipeline-rank": "Megatron's virtual-pipeline flags (give "
                                             "--virtual-pipeline-model-parallel-size)",
    "--async-save": "asynchronous checkpoint saves", "--non-persistent-": "non-persistent checkpoints",
    "--spec": "custom layer specs", "--yaml-cfg": "Megatron's YAML config (give --config RECIPE.yaml)",
    "--squared-relu": "other MLP activations", "--openai-gelu": "other MLP activations",
    "--quick-geglu": "other MLP activations", "--qk-layernorm": "QK layer norm",
    "--rl-": "reinforcement learning", "--inference-": "inference serving", "--sft": "Megatron's SFT path "
    "(give --dataset-type sft, docs/sft.md)", "--kitchen-": "kitchen quantization",
}
SCOPE_NOTE = "outside this project's scope (dense GPT/Llama pretraining; docs/training.md lists what is refused)"

# dest -> why it has no effect here (logged once at startup when set away from Megatron's default).
INERT = {
    "deprecated_use_mcore_models": "megatron-core models are the only ones",
    "attention_backend": "TE layers pick their fused attention; local layers use megatron's unfused attention",
    "calculate_per_token_loss": "the loss is always the mean over the global batch's prediction targets",
    "cross_entropy_loss_fusion": "the output layer's cross entropy is megatron-core's unfused one",
    "cross_entropy_fusion_impl": "the output layer's cross entropy is megatron-core's unfused one",
    "log_throughput": "the log line always carries throughput (tokens/s, TFLOP/s, MFU)",
    "distributed_timeout_minutes": "the process group uses torch's default timeout",
    "num_workers": "batches are read in the training process (megatron's indexed datasets, mmap)",
    "create_attention_mask_in_dataloader": "causal attention needs no mask from the data here",
    "grad_reduce_in_bf16": "gradients are reduced in FP32",
    "accumulate_allreduce_grads_in_fp32": "gradients are accumulated and reduced in FP32 already",
    "profile": "no built-in profiler; wrap the run in nsys or torch.profiler",
    "use_pytorch_profiler": "no built-in profiler; wrap the run in nsys or torch.profiler",
    "log_timers_to_tensorboard": "no timers", "log_memory_to_tensorboard": "memory is in the log line",
    "log_validation_ppl_to_tensorboard": "validation PPL is always written ('lm loss validation ppl')",
    "wandb_save_dir": "W&B writes to its default directory",
    "no_persist_layer_norm": "no persistent layer norm kernel here",
    "use_cpu_initialization": "parameters are initialized on the device they train on",
}


def _signal(text: str) -> str:
    """SIGTERM / TERM / 15 -> 'SIGTERM' (what signal.Signals names)."""
    try:
        sig = signal.Signals(int(text)) if text.isdigit() else signal.Signals[text if text.startswith("SIG") else "SIG" + text]
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"not a signal: {text!r} (e.g. SIGTERM, SIGUSR1, 15)") from None
    return sig.name


def out_of_scope(option: str) -> str | None:
    """What ``option`` (a ``--flag`` as typed, ``=value`` allowed) belongs to, if it is refused."""
    flag = option.split("=", 1)[0]
    for key, what in OUT_OF_SCOPE.items():
        if flag == key or (key.endswith("-") and flag.startswith(key)):
            return what
    return None


def add_accepted_args(p: argparse.ArgumentParser) -> None:
    """Megatron flags besides the core ones: the architecture, LR-by-samples, logging and
    checkpoint extras, and the inert ones (help says so)."""
    g = p.add_argument_group("architecture (Megatron-LM's flags; --block is a shorthand for them)")
    g.add_argument("--normalization", choices=["LayerNorm", "RMSNorm"], default="LayerNorm", help="norm of each block")
    g.add_argument("--swiglu", action="store_true", help="SwiGLU MLP (gated SiLU); GELU MLP without it")
    g.add_argument("--disable-bias-linear", dest="add_bias_linear", action="store_false",
                   help="no biases in the linear layers (required here: this project builds bias-free blocks)")
    g.add_argument("--position-embedding-type", choices=["learned_absolute", "rope", "mrope", "relative", "none"],
                   default="learned_absolute", help="position encoding (only rope is built here)")
    g.add_argument("--use-rotary-position-embeddings", action="store_true",
                   help="Megatron's older spelling of --position-embedding-type rope")
    g.add_argument("--rotary-percent", type=float, default=1.0, help="fraction of each head's dims RoPE rotates (1.0 only)")
    g.add_argument("--untie-embeddings-and-output-weights", action="store_true",
                   help="untied output head (required here: a fixed code cannot be tied to a head)")
    g.add_argument("--group-query-attention", action="store_true",
                   help="grouped-query attention with --num-query-groups groups (without it, multi-head attention)")
    g.add_argument("--kv-channels", type=int, default=None,
                   help="per-head projection size (default hidden-size / num-attention-heads, the only value built here)")
    g.add_argument("--max-position-embeddings", type=int, default=None,
                   help="longest sequence the positions cover (RoPE: must be >= --seq-length)")
    g.add_argument("--apply-layernorm-1p", dest="layernorm_zero_centered_gamma", action="store_true",
                   help="norm weights stored zero-centred, applied as 1 + w (TE layers only)")
    g.add_argument("--attention-dropout", type=float, default=0.1, help="dropout on the attention probabilities")
    g.add_argument("--hidden-dropout", type=float, default=0.1, help="dropout on the block outputs (residual adds)")
    g.add_argument("--use-mcore-models", dest="deprecated_use_mcore_models", action="store_true",
                   help="accepted (megatron-core models are the only ones)")
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
    g.add_argument("--tensorboard-log-interval", type=int, default=1, help="steps between TensorBoard scalars")
    g.add_argument("--wandb-exp-name", default=None, help="W&B run name (the run id is kept with the checkpoint)")
    g.add_argument("--save-retain-interval", type=int, default=None,
                   help="keep only checkpoints whose step is a multiple of N, and the newest (default: keep all)")
    g.add_argument("--no-load-optim", action="store_true", default=None,
                   help="resume without the optimizer's state (Adam moments start fresh)")
    g.add_argument("--no-load-rng", action="store_true", default=None, help="resume without the saved RNG states")
    g.add_argument("--exit-signal", type=_signal, default="SIGTERM",
                   help="the signal --exit-signal-handler catches (e.g. SIGUSR1 for Slurm's --signal=B:USR1@300)")
    g.add_argument("--ckpt-format", choices=["torch", "torch_dist", "torch_dcp", "fsdp_dtensor"], default="torch_dist",
                   help="checkpoint format (torch_dist only: megatron-core's dist_checkpointing)")
    g = p.add_argument_group("accepted with no effect here (a startup line names the ones set)")
    for flag, dest, kind in (
        ("--calculate-per-token-loss", "calculate_per_token_loss", "true"),
        ("--cross-entropy-loss-fusion", "cross_entropy_loss_fusion", "true"),
        ("--log-throughput", "log_throughput", "true"),
        ("--grad-reduce-in-bf16", "grad_reduce_in_bf16", "true"),
        ("--accumulate-allreduce-grads-in-fp32", "accumulate_allreduce_grads_in_fp32", "true"),
        ("--profile", "profile", "true"), ("--use-pytorch-profiler", "use_pytorch_profiler", "true"),
        ("--log-timers-to-tensorboard", "log_timers_to_tensorboard", "true"),
        ("--log-memory-to-tensorboard", "log_memory_to_tensorboard", "true"),
        ("--log-validation-ppl-to-tensorboard", "log_validation_ppl_to_tensorboard", "true"),
        ("--no-persist-layer-norm", "no_persist_layer_norm", "true"),
        ("--use-cpu-initialization", "use_cpu_initialization", "true"),
        ("--no-create-attention-mask-in-dataloader", "create_attention_mask_in_dataloader", "false"),
    ):
        g.add_argument(flag, dest=dest, action="store_true" if kind == "true" else "store_false",
                       default=None if dest == "use_cpu_initialization" else kind != "true",
                       help="accepted; " + INERT[dest])
    g.add_argument("--cross-entropy-fusion-impl", choices=["native", "te"], default="native",
                   help="accepted; " + INERT["cross_entropy_fusion_impl"])
    g.add_argument("--distributed-timeout-minutes", type=int, default=10, help="accepted; " + INERT["distributed_timeout_minutes"])
    g.add_argument("--num-workers", type=int, default=2, help="accepted; " + INERT["num_workers"])
    g.add_argument("--profile-step-start", type=int, default=10, help="accepted; " + INERT["profile"])
    g.add_argument("--profile-step-end", type=int, default=12, help="accepted; " + INERT["profile"])
    g.add_argument("--wandb-save-dir", default=None, help="accepted; " + INERT["wandb_save_dir"])


def inert_in_use(a: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    """The inert flags this run set away from Megatron's default, as 'flag (why)'."""
    out = []
    for action in parser._actions:
        if action.dest in INERT and getattr(a, action.dest) != action.default:
            out.append(f"{action.option_strings[0]} ({INERT[action.dest]})")
    return sorted(set(out))


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
    (one line) for what is not built here: a tied head, linear biases, positions other than RoPE."""
    if a.use_rotary_position_embeddings:
        a.position_embedding_type = "rope"
    if not a.untie_embeddings_and_output_weights:
        raise ValueError("the output head is always untied here (a fixed code cannot be tied to a head): give "
                         "--untie-embeddings-and-output-weights (Megatron-LM's default ties them), or --block llama")
    if a.add_bias_linear:
        raise ValueError("linear biases are not built here: give --disable-bias-linear (Megatron-LM's default adds "
                         "them), or --block llama")
    if a.position_embedding_type != "rope":
        raise ValueError(f"--position-embedding-type {a.position_embedding_type} is not built here: give "
                         "--position-embedding-type rope (Megatron-LM's default is learned_absolute), or --block llama")
    if a.rotary_percent != 1.0:
        raise ValueError(f"--rotary-percent {a.rotary_percent}: only 1.0 is built here")
    return {("RMSNorm", True): "llama", ("LayerNorm", False): "gpt_gelu", ("LayerNorm", True): "layernorm_swiglu",
            ("RMSNorm", False): "rmsnorm_gelu"}[(a.normalization, bool(a.swiglu))]
