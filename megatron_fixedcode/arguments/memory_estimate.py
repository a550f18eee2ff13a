"""What a dry run tells a login node: the parallel layout, microbatches and a per-GPU memory
estimate (the arithmetic of docs/SCALING.md), and whether the recipe needs Transformer Engine.

Pure arithmetic on the parsed flags: no torch, so it runs where the cluster's Python has none. Outside the
arguments package the dry run calls :func:`print_plan` with the :class:`PretrainConfig`; the functions below
it read the parsed flags, which are this package's own.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from megatron_fixedcode.models.config import padded_vocab_size
from megatron_fixedcode.utils.te_install import TE_INSTALL_HINT

if TYPE_CHECKING:
    from megatron_fixedcode.arguments.parse import PretrainConfig

GB = 1e9
RUNTIME_BYTES = 3 * GB  # CUDA context, cuBLAS/NCCL workspaces (docs/SCALING.md)


def print_plan(cfg: PretrainConfig, world_size: int) -> None:
    """The dry run's report on stderr (stdout is the config JSON that launchers read): the Transformer Engine
    warning, then the layout, microbatches and memory per GPU for ``world_size`` GPUs (or why there is no plan)."""
    warning = te_warning(cfg.args)
    if warning:
        print(warning, file=sys.stderr)
    try:
        p = plan(cfg.args, world_size)
        lines = [*format_plan(p), checkpoint_cadence(p, cfg.args)]
    except ValueError as e:
        lines = [f"dry run: no plan for WORLD_SIZE={world_size}: {e}"]
    print("\n".join(lines), file=sys.stderr)


def vocab_size_of(a: argparse.Namespace) -> tuple[int, str]:
    """(vocabulary size, where it came from): --vocab-size, a tokenizer.json, GPT2BPETokenizer's
    vocab.json (its entries, as Megatron-LM counts them), or an assumption."""
    if a.vocab_size:
        return a.vocab_size, "--vocab-size"
    if a.tokenizer_type == "GPT2BPETokenizer" and a.vocab_file and Path(a.vocab_file).is_file():
        try:
            return len(json.loads(Path(a.vocab_file).read_text(encoding="utf-8"))), a.vocab_file
        except (OSError, ValueError, TypeError):
            pass
    path = Path(a.tokenizer_model) if a.tokenizer_model else None
    if path is not None and path.is_dir():
        path = path / "tokenizer.json"
    if path is not None and path.suffix == ".json" and path.is_file():
        try:
            data = json.loads(path.read_text())
            ids = list(data["model"]["vocab"].values()) + [t["id"] for t in data.get("added_tokens", [])]
            return max(ids) + 1, str(path)
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return 65536, "assumed (give --vocab-size or a tokenizer.json)"


def uses_transformer_engine(a: argparse.Namespace) -> bool:
    named_te = a.transformer_impl == "transformer_engine" and getattr(a, "transformer_impl_given", True)
    return named_te or bool(a.fp8) or bool(a.tp_comm_overlap)


def te_warning(a: argparse.Namespace) -> str | None:
    """A warning (not an error: login nodes often lack GPUs and TE) when the recipe needs TE here absent."""
    if not uses_transformer_engine(a) or importlib.util.find_spec("transformer_engine") is not None:
        return None
    wants = [
        f"--transformer-impl {a.transformer_impl}" if a.transformer_impl == "transformer_engine" else None,
        f"--fp8-format {a.fp8}" if a.fp8 else None,
        "--tp-comm-overlap" if a.tp_comm_overlap else None,
    ]
    return (
        f"warning: this run asks for Transformer Engine ({', '.join(w for w in wants if w)}), which is not "
        f"installed here: the compute nodes will need it ({TE_INSTALL_HINT})"
    )


def block_parameters(a: argparse.Namespace) -> tuple[int, int]:
    """(parameters of one transformer block, of the final norm) as megatron-core builds them: attention
    and MLP weights, linear biases (--disable-bias-linear off, --add-qkv-bias), LayerNorm's weight and
    bias or RMSNorm's weight, and --qk-layernorm's per-head norms."""
    h, kv, ffn = a.hidden_size, a.kv_channels or a.hidden_size // a.num_attention_heads, a.ffn_hidden_size
    q = a.num_attention_heads * kv
    k = (a.num_query_groups if a.group_query_attention else a.num_attention_heads) * kv
    up = 2 * ffn if a.swiglu else ffn  # a gated MLP's fc1 holds the gate and the up projection
    norm = 2 if a.normalization == "LayerNorm" else 1  # parameters per normalized channel
    attention = h * (q + 2 * k) + q * h + (q + 2 * k if a.add_qkv_bias or a.add_bias_linear else 0)
    attention += (h if a.add_bias_linear else 0) + (2 * norm * kv if a.qk_layernorm else 0)
    mlp = h * up + ffn * h + (up + h if a.add_bias_linear else 0)
    return attention + mlp + 2 * norm * h, norm * h


def plan(a: argparse.Namespace, world_size: int) -> dict:
    """Layout, microbatches and the per-GPU memory estimate (bytes) of the run on ``world_size`` GPUs."""
    tp, pp, cp = a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.context_parallel_size
    model_parallel = tp * pp * cp
    if world_size % model_parallel:
        raise ValueError(f"{world_size} GPUs are not a multiple of TP x PP x CP = {model_parallel}")
    dp = world_size // model_parallel
    mbs, gbs = a.micro_batch_size, a.global_batch_size or a.micro_batch_size * dp
    if gbs % (mbs * dp):
        raise ValueError(f"global batch {gbs} is not divisible by micro batch {mbs} x data-parallel size {dp}")
    microbatches = gbs // (mbs * dp)

    h, heads, layers, s = a.hidden_size, a.num_attention_heads, a.num_layers, a.seq_length
    gated = bool(a.swiglu)
    vocab, vocab_from = vocab_size_of(a)
    padded = padded_vocab_size(vocab, a.make_vocab_size_divisible_by, tp, a.padded_vocab_size)
    block, final_norm = block_parameters(a)
    learned = a.input_embedding == "learned"
    tied = learned and not a.untie_embeddings_and_output_weights  # Megatron-LM's default: the head is the table
    positions = (a.max_position_embeddings or s) * h if a.position_embedding_type == "learned_absolute" else 0
    table = padded * h + positions if learned else 0
    head = padded * h if not tied or pp > 1 else 0  # with PP > 1 the last stage keeps a copy of a tied table
    total = layers * block + (0 if tied else padded * h) + table + final_norm
    # The fullest stage: its share of the blocks, plus the output head and input table when PP = 1
    # (with PP > 1 the first stage holds the table, the last the head).
    on_gpu = (layers // pp * block + (head + table if pp == 1 else max(head, table))) / tp

    autocast = a.precision == "fp32-autocast-bf16"
    if a.bf16:  # bf16 weight, fp32 grad, fp32 master, Adam m and v
        replicated, shardable = 2 + 4, 4 + 8
    elif autocast:  # fp32 weight and grad, the bf16 weight casts autocast keeps for backward, Adam m and v
        replicated, shardable = 4 + 4 + 2, 8
    else:  # fp32 weight and grad, Adam m and v
        replicated, shardable = 4 + 4, 8
    per_param = replicated + shardable / (dp if a.use_distributed_optimizer else 1)
    states = on_gpu * per_param

    te = a.transformer_impl != "local"  # auto picks TE where it is installed (the GPU nodes)
    sbh = (s / cp) * mbs * h
    units = 40 if gated else 32  # per s·b·h, 16-bit activations, dropout 0 (docs/SCALING.md)
    if not te and a.recompute_granularity != "selective":
        units += 5 * heads * (s / cp) / h  # unfused attention keeps the s x s scores
    act_bytes = 2 if a.bf16 or autocast else 4
    if autocast:  # the two norm inputs (the residual stream) are kept in fp32: 2 more bytes each
        units += 4
    per_block = units * sbh * act_bytes / 2 / tp
    blocks_here = layers // pp
    if a.recompute_granularity == "full":
        activations = blocks_here * 2 * sbh * act_bytes / 2 / tp + per_block
    else:
        activations = blocks_here * per_block
    activations *= min(pp, microbatches)  # 1F1B: the first stage holds up to PP microbatches
    logits = (s / cp) * mbs * padded / tp * (act_bytes + 4 + 4)  # logits, fp32 loss, its softmax/grad
    total_bytes = states + activations + logits + RUNTIME_BYTES
    return {
        "world_size": world_size,
        "tp": tp,
        "pp": pp,
        "cp": cp,
        "dp": dp,
        "micro_batch_size": mbs,
        "global_batch_size": gbs,
        "microbatches": microbatches,
        "vocab_size": vocab,
        "vocab_from": vocab_from,
        "padded_vocab_size": padded,
        "parameters": total,
        "parameters_per_gpu": on_gpu,
        "bytes": {
            "weights_grads_optimizer": states,
            "activations": activations,
            "logits": logits,
            "runtime": RUNTIME_BYTES,
            "total": total_bytes,
        },
    }


ASSUMED_WRITE_BYTES_PER_S = 1e9  # per GPU to the shared filesystem: an assumption, said in the line


def checkpoint_cadence(p: dict, a: argparse.Namespace) -> str:
    """The dry run's suggestion for ``--non-persistent-save-interval``: Young/Daly's interval for this job's
    size at the Llama 3 report's failure rate and a save of this checkpoint at an assumed write rate
    (checkpoint/cadence.py; benchmarks/goodput.py simulates the strategies)."""
    from megatron_fixedcode.checkpoint.cadence import mtbf_seconds, young_daly_interval
    from megatron_fixedcode.checkpoint.save_checks import estimate_checkpoint_bytes

    ckpt = estimate_checkpoint_bytes(
        int(p["parameters"]),
        bf16=a.bf16,
        distributed_optimizer=a.use_distributed_optimizer,
        fully_reshardable=a.dist_ckpt_optim_fully_reshardable,
    )
    per_gpu = ckpt / p["world_size"]  # every rank writes its share (megatron's fully parallel save)
    save_s = per_gpu / ASSUMED_WRITE_BYTES_PER_S
    mtbf = mtbf_seconds(p["world_size"])
    interval = young_daly_interval(save_s, mtbf)
    return (
        f"dry run: checkpoint ~{ckpt / GB:.1f} GB, {per_gpu / GB:.2f} GB per GPU (~{save_s:.1f} s at an assumed 1 GB/s); "
        f"at the Llama 3 report's failure rate a {p['world_size']}-GPU job fails every ~{mtbf / 86400:.1f} days: "
        f"checkpoint every ~{interval / 60:.0f} min (Young/Daly): --non-persistent-save-interval = that / step time"
    )


def format_plan(p: dict) -> list[str]:
    b = p["bytes"]
    return [
        f"dry run: {p['world_size']} GPU{'s' if p['world_size'] != 1 else ''} = TP {p['tp']} x PP {p['pp']} x CP {p['cp']} x DP {p['dp']}; "
        f"global batch {p['global_batch_size']} = micro batch {p['micro_batch_size']} x {p['microbatches']} "
        f"microbatches x DP {p['dp']}",
        f"dry run: {p['parameters'] / 1e6:,.1f}M parameters ({p['parameters_per_gpu'] / 1e6:,.1f}M on the fullest GPU), "
        f"vocabulary {p['vocab_size']:,} ({p['vocab_from']}), padded {p['padded_vocab_size']:,}",
        f"dry run: memory per GPU (computed, docs/SCALING.md): weights+grads+optimizer "
        f"{b['weights_grads_optimizer'] / GB:.1f} GB, activations {b['activations'] / GB:.1f} GB, "
        f"logits+loss {b['logits'] / GB:.1f} GB, runtime ~{b['runtime'] / GB:.0f} GB: ~{b['total'] / GB:.1f} GB",
    ]
