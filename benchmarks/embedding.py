"""The input layer alone: megatron-core's learned table vs the fixed code, in one process.

Variants, run alternately (see ``common.time_interleaved``):

* ``learned`` — megatron-core ``LanguageModelEmbedding`` as our builder makes it (TP=1, a
  world-size-1 gloo group), trained with torch ``AdamW(fused=True)`` (the fastest CPU optimizer);
* ``fixed_binary`` / ``fixed_gf2`` — ``FixedCodeEmbedding``, table-free (bit operations on ids);
* ``fixed_gf2_lookup`` — ``FixedCodeEmbedding`` gathering rows of its V×K uint8 codebook;
  (all three with the default ``kernel="auto"``: the compiled one-pass CPU kernel where it builds)
* ``torch_ops_gf2`` — ``fixed_gf2`` forced onto torch ops (``kernel="torch"``, the fallback where
  no C++ compiler is available): shown for before/after, not part of the headline fraction;
* ``bandwidth`` — ``torch.empty(S, B, H).fill_(1)``: a fresh output of the same shape and dtype,
  allocated the same way, written once. The fixed code cannot beat this; it is the bound.

Measured: forward; forward + backward; forward + backward + optimizer step (for the fixed code
there is nothing to backpropagate into or update, so all three are its forward); peak tensor
bytes of one step (``common.TensorBytes``: resident state + transient tensors); gradient and
optimizer-state bytes.

Shape legend: B batch, S sequence, H hidden, V vocabulary.

Run: ``python benchmarks/embedding.py [--small] [--json] [--repeats N]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from common import (  # noqa: E402
    MIB,
    TensorBytes,
    emit,
    gradient_tensors,
    machine,
    optimizer_state_tensors,
    storage_bytes,
    time_interleaved,
)

from megatron_fixedcode.codes import CodeSpec  # noqa: E402
from megatron_fixedcode.compat import ParallelLayout, initialize_distributed  # noqa: E402
from megatron_fixedcode.kernels import fixed_code_cpu_kernel  # noqa: E402
from megatron_fixedcode.models import FixedCodeEmbedding, ModelConfig, build_transformer_config  # noqa: E402
from megatron_fixedcode.models.gpt import learned_embedding  # noqa: E402

SIZES = {  # name: (V, H, B, S)
    "full": (49152, 2048, 4, 2048),
    "small": (49152, 512, 2, 512),
    "smoke": (4096, 64, 2, 64),
}


class Variant:
    """One input layer with forward / forward+backward / step callables on a fixed batch."""

    def __init__(self, module: torch.nn.Module, ids_BS: torch.Tensor, optimizer=None):
        self.module, self.ids_BS, self.optimizer = module, ids_BS, optimizer
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.pos_BS = torch.arange(ids_BS.shape[1]).expand_as(ids_BS)
        self.grad_SBH = None

    def forward(self):
        return self.module(self.ids_BS, self.pos_BS)

    def forward_backward(self):
        x_SBH = self.forward()
        if not x_SBH.requires_grad:
            return x_SBH  # the fixed code: nothing to backpropagate into
        if self.grad_SBH is None:
            self.grad_SBH = torch.ones_like(x_SBH)
        x_SBH.backward(self.grad_SBH)
        return None

    def step(self):
        self.forward_backward()
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=False)  # reuse the V×H grad: no fresh 0-fill + faults

    def peak_step_bytes(self) -> dict:
        """Tensor bytes of one step: resident (params, grads, optimizer state) + transient peak."""
        resident = storage_bytes(
            [
                *self.module.parameters(),
                *self.module.buffers(),
                *gradient_tensors([self.module]),
                *(optimizer_state_tensors(self.optimizer) if self.optimizer else []),
            ]
        )
        with TensorBytes() as tracker:
            self.step()
        return {
            "resident_bytes": resident,
            "transient_peak_bytes": tracker.peak,
            "peak_bytes": resident + tracker.peak,
            "param_bytes": storage_bytes(self.params),
            "grad_bytes": storage_bytes(gradient_tensors([self.module])),
            "optimizer_state_bytes": storage_bytes(optimizer_state_tensors(self.optimizer)) if self.optimizer else 0,
        }


def build_variants(vocab: int, hidden: int, batch: int, seq: int) -> dict[str, Variant]:
    pg = initialize_distributed(ParallelLayout())
    cfg = ModelConfig(
        num_layers=1,
        hidden_size=hidden,
        num_attention_heads=1,
        ffn_hidden_size=hidden,
        seq_length=seq,
        vocab_size=vocab,
    )
    config = build_transformer_config(cfg, ParallelLayout())
    torch.manual_seed(0)
    ids_BS = torch.randint(0, vocab, (batch, seq))
    learned = learned_embedding(
        config=config,
        vocab_size=cfg.padded_vocab_size(),
        max_sequence_length=seq,
        position_embedding_type="rope",
        tp_group=pg.tp,
    )
    variants = {
        "learned": Variant(
            learned,
            ids_BS,
            torch.optim.AdamW(
                learned.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01, fused=True
            ),
        )
    }
    for name, kind, impl, kernel in (
        ("fixed_binary", "binary", "table_free", "auto"),
        ("fixed_gf2", "gf2", "table_free", "auto"),
        ("fixed_gf2_lookup", "gf2", "lookup", "auto"),
        ("torch_ops_gf2", "gf2", "table_free", "torch"),
    ):
        spec = CodeSpec.create(kind=kind, vocab_size=vocab, hidden_size=hidden, implementation=impl)
        variants[name] = Variant(FixedCodeEmbedding(config, spec, tp_group=pg.tp, kernel=kernel), ids_BS)
    return variants


def run(size: str, repeats: int) -> dict:
    vocab, hidden, batch, seq = SIZES[size]
    variants = build_variants(vocab, hidden, batch, seq)
    out_dtype = variants["fixed_gf2"].forward().dtype
    fixed_names = [n for n in variants if n.startswith("fixed")]
    for v in variants.values():  # first step creates AdamW state and .grad: not part of a step
        v.step()
    memory = {n: v.peak_step_bytes() for n, v in variants.items()}

    def bandwidth():
        return torch.empty(seq, batch, hidden, dtype=out_dtype).fill_(1.0)

    # Forwards take milliseconds and this is where the bound is compared: 10x the rounds, so
    # the medians hold still on a shared machine.
    forward_rounds = 10 * repeats
    fwd = time_interleaved({"bandwidth": bandwidth, **{n: v.forward for n, v in variants.items()}}, forward_rounds)
    fwd_bwd = time_interleaved({n: v.forward_backward for n, v in variants.items()}, repeats)
    step = time_interleaved({n: v.step for n, v in variants.items()}, repeats)

    bw = fwd["bandwidth"]["wall_s"]
    per_variant = {
        n: {
            "forward_s": fwd[n]["wall_s"],
            "forward_cpu_s": fwd[n]["cpu_s"],
            "forward_backward_s": fwd_bwd[n]["wall_s"],
            "step_s": step[n]["wall_s"],
            "step_cpu_s": step[n]["cpu_s"],
            **memory[n],
        }
        for n in variants
    }
    fraction = {n: bw / fwd[n]["wall_s"] for n in fixed_names}
    torch_ops_fraction = bw / fwd["torch_ops_gf2"]["wall_s"]
    learned_step = step["learned"]["wall_s"]
    output_bytes = seq * batch * hidden * torch.empty((), dtype=out_dtype).element_size()
    return {
        "benchmark": "embedding",
        "size": size,
        "vocab_size": vocab,
        "padded_vocab_size": vocab,
        "hidden_size": hidden,
        "micro_batch_size": batch,
        "seq_length": seq,
        "output_dtype": str(out_dtype),
        "output_bytes": output_bytes,
        "repeats": repeats,
        "machine": machine(),
        "load_average_during": [fwd["load_average"][0], step["load_average"][1]],
        "bandwidth_s": bw,
        "bandwidth_GBps": output_bytes / bw / 1e9,
        "forward_rounds": forward_rounds,
        "variants": per_variant,
        # Throughput as a fraction of the bandwidth bound (1.0 = as fast as writing the output);
        # the headline is the slowest fixed variant.
        "fixed_fwd_fraction_of_bandwidth_by_variant": fraction,
        "fixed_fwd_fraction_of_bandwidth": min(fraction.values()),
        "torch_ops_fwd_fraction_of_bandwidth": torch_ops_fraction,
        "fused_cpu_kernel": fixed_code_cpu_kernel() is not None and not torch.cuda.is_available(),
        "fixed_over_learned_step_time": max(step[n]["wall_s"] for n in fixed_names) / learned_step,
        "fixed_over_learned_step_cpu_time": max(step[n]["cpu_s"] for n in fixed_names) / step["learned"]["cpu_s"],
        "learned_state_bytes": memory["learned"]["param_bytes"]
        + memory["learned"]["grad_bytes"]
        + memory["learned"]["optimizer_state_bytes"],
        "fixed_state_bytes": max(
            memory[n]["param_bytes"] + memory[n]["grad_bytes"] + memory[n]["optimizer_state_bytes"] for n in fixed_names
        ),
        "fixed_peak_over_learned_peak": max(memory[n]["peak_bytes"] for n in fixed_names)
        / memory["learned"]["peak_bytes"],
    }


def table(r: dict) -> str:
    lines = [
        f"input layer: V={r['vocab_size']} H={r['hidden_size']} tokens={r['micro_batch_size']}x{r['seq_length']} "
        f"{r['output_dtype']}  threads={r['machine']['torch_threads']} load={r['load_average_during']}",
        f"bandwidth reference (empty+fill_ of {r['output_bytes'] / MIB:.0f} MiB): "
        f"{r['bandwidth_s'] * 1e3:.2f} ms ({r['bandwidth_GBps']:.2f} GB/s)",
        f"{'variant':18s} {'fwd ms':>8s} {'fwd+bwd ms':>11s} {'step ms':>9s} {'peak MiB':>9s} "
        f"{'grad MiB':>9s} {'opt MiB':>8s}",
    ]
    for n, v in r["variants"].items():
        lines.append(
            f"{n:18s} {v['forward_s'] * 1e3:8.2f} {v['forward_backward_s'] * 1e3:11.2f} "
            f"{v['step_s'] * 1e3:9.2f} {v['peak_bytes'] / MIB:9.1f} {v['grad_bytes'] / MIB:9.1f} "
            f"{v['optimizer_state_bytes'] / MIB:8.1f}"
        )
    lines.append(
        f"fixed forward / bandwidth bound (throughput, slowest fixed): {r['fixed_fwd_fraction_of_bandwidth']:.2f}"
        f"  (fused CPU kernel: {r['fused_cpu_kernel']}; torch ops: {r['torch_ops_fwd_fraction_of_bandwidth']:.2f})"
    )
    lines.append(
        f"fixed step / learned step (wall): {r['fixed_over_learned_step_time']:.4f}  "
        f"(CPU time: {r['fixed_over_learned_step_cpu_time']:.4f})"
    )
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--small", action="store_true", help="V=49152, H=512, 2x512 tokens")
    p.add_argument("--smoke", action="store_true", help="a few seconds; for tests")
    p.add_argument(
        "--repeats", type=int, default=None, help="timed rounds per variant (median reported); forwards get 10x as many"
    )
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    size = "smoke" if a.smoke else "small" if a.small else "full"
    repeats = a.repeats or {"smoke": 3, "small": 20, "full": 15}[size]
    emit(run(size, repeats), a.json, table)


if __name__ == "__main__":
    main()
