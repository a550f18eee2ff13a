"""Peak memory of the perplexity reduction at 1.7B-like logits: the float64 cross-entropy over the
whole batch (the code before 2026-12-02) against :func:`megatron_fixedcode.eval.perplexity.summed_nll`
(float64 log-softmax a chunk of positions at a time), on the same float32 logits ``[B, S, V]``.

Each variant runs in a fresh child process, so that one's allocations cannot hide the other's. Per
variant: the peak bytes of tensors the reduction creates (``TensorBytes``, beyond the logits), and
the growth of the process's peak resident memory (``ru_maxrss``) over the reduction (on CUDA:
``torch.cuda.max_memory_allocated`` growth instead). The NLL sums of both variants are printed too
(they agree to float64 rounding).

Run: ``python benchmarks/eval_memory.py [--batch-size 2] [--seq-length 2048] [--vocab-size 49152]
[--device cpu] [--chunk-mib M] [--json]``; ``--smoke``: a small shape, for the tests.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import MIB, TensorBytes, emit, machine  # noqa: E402


def _before(logits_BSV, tgt_BS):  # the reduction as it was: a float64 copy of the batch, then its log-softmax
    import torch

    return float(
        torch.nn.functional.cross_entropy(
            logits_BSV.double().flatten(0, 1), tgt_BS.flatten(), ignore_index=-100, reduction="sum"
        )
    )


def _after(logits_BSV, tgt_BS):
    from megatron_fixedcode.eval.perplexity import summed_nll

    return summed_nll(logits_BSV, tgt_BS)[0]


def child(
    variant: str, batch_size: int, seq_length: int, vocab_size: int, device: str, chunk_mib: float | None
) -> dict:
    import torch

    from megatron_fixedcode.eval import perplexity

    if chunk_mib is not None:
        perplexity.NLL_CHUNK_BYTES = int(chunk_mib * MIB)
    fn = {"before": _before, "after": _after}[variant]
    with torch.no_grad(), TensorBytes():  # imports and first-call set-up, outside the measurement
        fn(torch.randn(2, 3, 5, device=device), torch.zeros(2, 3, dtype=torch.long, device=device))
    torch.manual_seed(0)
    logits_BSV = torch.randn(batch_size, seq_length, vocab_size, device=device)
    tgt_BS = torch.randint(0, vocab_size, (batch_size, seq_length), device=device)
    tgt_BS[:, -7:] = -100  # some padding, as a ragged batch has
    with torch.no_grad():
        if device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        with TensorBytes() as counter:
            nll = fn(logits_BSV, tgt_BS)
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        process_growth = (torch.cuda.max_memory_allocated() - base) if device.startswith("cuda") else rss1 - rss0
    return {
        "variant": variant,
        "nll_sum": nll,
        "tensor_peak_bytes": counter.peak,
        "process_peak_growth_bytes": process_growth,
        "logits_bytes": logits_BSV.numel() * 4,
        "chunk_bytes": perplexity.NLL_CHUNK_BYTES,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--seq-length", type=int, default=2048)
    p.add_argument("--vocab-size", type=int, default=49152)
    p.add_argument("--device", default="cpu")
    p.add_argument("--chunk-mib", type=float, default=None, help="summed_nll's chunk (default: its NLL_CHUNK_BYTES)")
    p.add_argument("--smoke", action="store_true", help="B=2, S=64, V=4096, 1 MiB chunks")
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.smoke:
        a.batch_size, a.seq_length, a.vocab_size, a.chunk_mib = 2, 64, 4096, 1.0
    if a.child:
        print(json.dumps(child(a.child, a.batch_size, a.seq_length, a.vocab_size, a.device, a.chunk_mib)))
        return
    runs = {}
    for variant in ("before", "after"):
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                variant,
                "--batch-size",
                str(a.batch_size),
                "--seq-length",
                str(a.seq_length),
                "--vocab-size",
                str(a.vocab_size),
                "--device",
                a.device,
                *(["--chunk-mib", str(a.chunk_mib)] if a.chunk_mib else []),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        runs[variant] = json.loads(proc.stdout.strip().splitlines()[-1])
    result = {
        "machine": machine(),
        "batch_size": a.batch_size,
        "seq_length": a.seq_length,
        "vocab_size": a.vocab_size,
        "device": a.device,
        "variants": runs,
        "nll_relative_difference": abs(runs["after"]["nll_sum"] - runs["before"]["nll_sum"])
        / abs(runs["before"]["nll_sum"]),
    }

    def table(r: dict) -> str:
        lines = [
            f"B={r['batch_size']} S={r['seq_length']} V={r['vocab_size']} on {r['device']}: float32 logits "
            f"{r['variants']['before']['logits_bytes'] / MIB:,.0f} MiB",
            "variant   tensor peak MiB   process peak growth MiB   NLL sum",
        ]
        for name, v in r["variants"].items():
            lines.append(
                f"{name:8s}  {v['tensor_peak_bytes'] / MIB:15,.1f}   {v['process_peak_growth_bytes'] / MIB:23,.1f}"
                f"   {v['nll_sum']:.10e}"
            )
        lines.append(f"NLL relative difference {r['nll_relative_difference']:.1e}")
        return "\n".join(lines)

    emit(result, a.json, table)


if __name__ == "__main__":
    main()
