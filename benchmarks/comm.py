"""Communication of the input layer: what the learned table moves and the fixed code does not.

Two phases on 2 gloo ranks (run directly, the script relaunches itself under torchrun):

* TP=2 with sequence parallelism: the input layer of the model the trainer builds
  (``build_model_chunks``), forward and backward of one microbatch, every collective counted by
  wrapping torch's ProcessGroup (``compat.collectives.count_collectives``). The vocab-parallel
  table reduce-scatters its ``[s, b, h]`` output forward and all-gathers the gradient backward;
  the fixed code computes each rank's own sequence shard and calls nothing.
* DP=2 (TP=1): the gradient all-reduce bytes of one whole training step (megatron DDP's grad
  buffer in ``finalize_model_grads``), learned vs binary: the difference is the table's gradient.

Byte counts: ``calls`` and ``bytes`` are what the counter records (the first tensor argument of
each collective: the output shard of a reduce-scatter, the gathered output of an all-gather, the
buffer of an all-reduce); ``full_activation_bytes`` is the ``[s, b, h]`` tensor each TP
collective reduces or gathers, which is what crosses the interconnect up to the (tp-1)/tp factor.

Run: ``python benchmarks/comm.py [--smoke] [--json]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from common import MIB, emit, machine  # noqa: E402

from megatron_fixedcode.compat import ParallelLayout, destroy_distributed, initialize_distributed  # noqa: E402
from megatron_fixedcode.compat.collectives import count_collectives, num_collective_calls  # noqa: E402
from megatron_fixedcode.models import ModelConfig, build_transformer_config  # noqa: E402
from megatron_fixedcode.training.forward_backward import forward_backward  # noqa: E402
from megatron_fixedcode.training.model_chunks import build_model_chunks  # noqa: E402

INPUTS = ("learned", "binary", "gf2")
SHAPES = {  # V, H, input-layer sequence, DP-phase sequence
    "paper2": dict(vocab_size=49152, hidden_size=2048, num_attention_heads=16, seq=2048, dp_seq=128),
    "smoke": dict(vocab_size=4096, hidden_size=64, num_attention_heads=4, seq=64, dp_seq=32),
}
PAPER2_SEQUENCES_PER_STEP = 128  # 2 GPUs x 8 sequences x 8 accumulation steps


def model_config(shape: dict, inp: str, seq: int) -> ModelConfig:
    return ModelConfig(
        num_layers=1,
        hidden_size=shape["hidden_size"],
        num_attention_heads=shape["num_attention_heads"],
        ffn_hidden_size=4 * shape["hidden_size"],
        seq_length=seq,
        vocab_size=shape["vocab_size"],
        input_embedding=inp,
        transformer_impl="local",
    )


def summarize(counts) -> dict:
    ops = {k: v for k, v in counts.items() if not k.endswith(":bytes") and not k.startswith("device:")}
    return {
        "calls": num_collective_calls(counts),
        "bytes": sum(v for k, v in counts.items() if k.endswith(":bytes")),
        "ops": ops,
    }


def tp_phase(shape: dict, micro: int) -> dict:
    layout = ParallelLayout(tensor_model_parallel_size=2, sequence_parallel=True)
    pg = initialize_distributed(layout)
    out = {}
    for inp in INPUTS:
        cfg = model_config(shape, inp, shape["seq"])
        chunks = build_model_chunks(cfg, build_transformer_config(cfg, layout), layout, pg)
        embedding = chunks[0].module.embedding
        tokens_BS = torch.randint(
            0, cfg.vocab_size, (micro, cfg.seq_length), generator=torch.Generator().manual_seed(0)
        )
        with count_collectives() as fwd:
            x_SBH = embedding(tokens_BS, None)
        with count_collectives() as bwd:
            if x_SBH.requires_grad:
                x_SBH.backward(torch.ones_like(x_SBH))
        out[inp] = {
            "forward": summarize(fwd),
            "backward": summarize(bwd),
            "local_output_shape": list(x_SBH.shape),
            "trainable_params": sum(p.numel() for p in embedding.parameters()),
        }
        out[inp]["calls"] = out[inp]["forward"]["calls"] + out[inp]["backward"]["calls"]
        out[inp]["bytes"] = out[inp]["forward"]["bytes"] + out[inp]["backward"]["bytes"]
        del chunks, embedding, x_SBH
    full = shape["seq"] * micro * shape["hidden_size"] * 4
    for inp in INPUTS:
        out[inp]["full_activation_bytes"] = full * out[inp]["calls"]
        out[inp]["full_activation_bytes_per_paper2_step"] = (
            full * out[inp]["calls"] * PAPER2_SEQUENCES_PER_STEP // micro
        )
    return out


def dp_phase(shape: dict) -> dict:
    layout = ParallelLayout()
    pg = initialize_distributed(layout)
    out = {}
    for inp in ("learned", "binary"):
        torch.manual_seed(1234)
        cfg = model_config(shape, inp, shape["dp_seq"])
        chunks = build_model_chunks(cfg, build_transformer_config(cfg, layout), layout, pg)
        seq_BS = torch.randint(0, cfg.vocab_size, (1, cfg.seq_length + 1), generator=torch.Generator().manual_seed(0))
        batch = [
            {
                "tokens": seq_BS[:, :-1].contiguous(),
                "labels": seq_BS[:, 1:].contiguous(),
                "loss_mask": torch.ones(1, cfg.seq_length),
            }
        ]
        with count_collectives() as counts:
            forward_backward(chunks, batch, num_microbatches=1, seq_length=cfg.seq_length, micro_batch_size=1)
        grads = sum(b.grad_data.numel() * b.grad_data.element_size() for c in chunks for b in c.buffers)
        out[inp] = {**summarize(counts), "grad_buffer_bytes": grads, "padded_vocab_size": cfg.padded_vocab_size()}
        del chunks
    out["bytes_saved"] = out["learned"]["bytes"] - out["binary"]["bytes"]
    out["table_grad_bytes"] = out["learned"]["padded_vocab_size"] * shape["hidden_size"] * 4
    return out


def worker(a) -> None:
    shape = SHAPES["smoke" if a.smoke else "paper2"]
    result = {
        "benchmark": "comm",
        "shape": "smoke" if a.smoke else "paper2",
        "micro_batch_size": a.micro_batch_size,
        **{k: shape[k] for k in ("vocab_size", "hidden_size", "seq", "dp_seq")},
        "tp2_sp": tp_phase(shape, a.micro_batch_size),
        "dp2": dp_phase(shape),
    }
    if int(os.environ["RANK"]) == 0:
        result["machine"] = machine()
        result["fixed_input_layer_calls"] = max(result["tp2_sp"][i]["calls"] for i in ("binary", "gf2"))
        result["fixed_input_layer_bytes"] = max(result["tp2_sp"][i]["bytes"] for i in ("binary", "gf2"))
        result["learned_input_layer_bytes"] = result["tp2_sp"]["learned"]["bytes"]
        emit(result, a.json, table)
    destroy_distributed()


def table(r: dict) -> str:
    lines = [
        f"input layer under TP=2 + sequence parallelism, V={r['vocab_size']} H={r['hidden_size']} "
        f"{r['micro_batch_size']}x{r['seq']} tokens per microbatch (gloo, 2 ranks)"
    ]
    for inp in INPUTS:
        t = r["tp2_sp"][inp]
        lines.append(
            f"  {inp:8s} calls {t['calls']} (fwd {t['forward']['ops']}, bwd {t['backward']['ops']}); counted "
            f"{t['bytes'] / MIB:.3f} MiB; [s,b,h] reduced/gathered {t['full_activation_bytes'] / MIB:.3f} MiB "
            f"per microbatch, {t['full_activation_bytes_per_paper2_step'] / 2**30:.2f} GiB per paper-2 step"
        )
    d = r["dp2"]
    lines.append(
        f"data-parallel collectives per step (gradient all-reduce + loss reductions) (DP=2, 1 layer, H={r['hidden_size']}):"
    )
    for inp in ("learned", "binary"):
        lines.append(
            f"  {inp:8s} {d[inp]['bytes'] / MIB:.3f} MiB in {d[inp]['ops']} "
            f"(grad buffer {d[inp]['grad_buffer_bytes'] / MIB:.3f} MiB)"
        )
    lines.append(
        f"  saved {d['bytes_saved'] / MIB:.3f} MiB; table gradient V_pad x H x 4 = {d['table_grad_bytes'] / MIB:.3f} MiB"
    )
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="small shapes; for tests")
    p.add_argument("--micro-batch-size", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args(argv)
    if "LOCAL_RANK" in os.environ:
        return worker(a)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        __file__,
        *(argv if argv is not None else sys.argv[1:]),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    sys.exit(subprocess.run(cmd, env=env).returncode)


if __name__ == "__main__":
    main()
