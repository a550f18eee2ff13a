"""Throughput of the paper-2 1.7B recipe on one GPU with the real trainer (one variant per process).

    python scripts/gpu_check/bench.py --variant binary --data-dir OUT/bench-data --out OUT/bench-binary.json
    python scripts/gpu_check/bench.py --variant learned --check      # CPU: only validate the trainer flags

The recipe as it is (24 x 2048, FFN 8192 SwiGLU, seq 2048, micro batch 8, BF16, full recompute,
distributed optimizer) except the global batch: 8 sequences, one micro batch, no accumulation. The
recipe's 128 is 16 GPUs x 8 (or 8 GPUs x 8 x 2 accumulation steps): the work per micro batch is the
same, so the per-GPU rate carries over, less the data-parallel communication. Data: random tokens
(V = 49,152) in a Megatron index, so the step time is the model's. Reported: median step time over
the timed steps, tokens/s, model TFLOP/s and MFU, peak memory.

Model FLOPs per token = 6·N + 12·L·h·s, N = trainable parameters that do matrix multiplies (the
blocks and the output head; a learned input table is a lookup and is left out, so learned and binary
are credited the same work), the attention term as Megatron counts it; recomputation is not credited
(MFU, not hardware FLOP utilization).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from megatron_fixedcode.models.report import model_flops_per_token  # noqa: E402
from megatron_fixedcode.training.metrics import peak_bf16_flops  # noqa: E402

VARIANTS = {  # name -> (recipe input, extra trainer flags)
    "learned": ("learned", []),
    "binary": ("binary", []),
    "binary_fp8": ("binary", ["--transformer-impl", "transformer_engine", "--fp8-format", "hybrid",
                              "--fp8-recipe", "delayed", "--fp8-amax-history-len", "1024",
                              "--fp8-amax-compute-algo", "max"]),
}
VOCAB = 49152


def trainer_argv(variant: str, data_prefix: str, num_steps: int, micro_batch: int, global_batch: int) -> list[str]:
    recipe, extra = VARIANTS[variant]
    return ["--config", str(ROOT / f"examples/recipes/paper2_1p7b_{recipe}.yaml"), "--data-path", data_prefix,
            "--valid-data-path", data_prefix, "--tokenizer-model", "", "--dataset-type", "gpt",
            "--vocab-size", str(VOCAB), "--seed", "1234",
            "--micro-batch-size", str(micro_batch), "--global-batch-size", str(global_batch),
            "--train-iters", str(num_steps), "--lr-warmup-iters", "1", "--lr-decay-iters", "1000",
            "--log-interval", "1000", *extra]


def make_data(data_dir: Path, num_tokens: int = 2_000_000) -> str:
    """Random-token documents of 4096 tokens (written once, shared by the variants)."""
    prefix = data_dir / "random_text_document"
    if Path(f"{prefix}.idx").exists():
        return str(prefix)
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    data_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    builder = IndexedDatasetBuilder(f"{prefix}.bin.tmp", dtype=np.uint16)
    for _ in range(num_tokens // 4096):
        builder.add_item(torch.from_numpy(rng.integers(0, VOCAB, 4096, dtype=np.int64)))
        builder.end_document()
    builder.finalize(f"{prefix}.idx")
    Path(f"{prefix}.bin.tmp").rename(f"{prefix}.bin")
    return str(prefix)


def summarize(*, variant: str, gpu: str, step_times: list[float], tokens_per_step: int, flops_tok: float,
              peak_alloc: int, peak_reserved: int, extra: dict) -> dict:
    """The numbers the report shows (also used on fake inputs by the dry run)."""
    step_s = statistics.median(step_times)
    tokens_s = tokens_per_step / step_s
    tflops = tokens_s * flops_tok / 1e12
    peak = peak_bf16_flops(gpu)
    return {"variant": variant, "gpu": gpu, "step_time_s": step_s, "step_times_s": step_times,
            "tokens_per_step": tokens_per_step, "tokens_per_s": tokens_s, "model_flops_per_token": flops_tok,
            "model_tflops_per_s": tflops, "mfu": tflops * 1e12 / peak if peak else None,
            "peak_bf16_tflops": peak / 1e12 if peak else None,
            "peak_memory_allocated_gib": peak_alloc / 2**30, "peak_memory_reserved_gib": peak_reserved / 2**30,
            **extra}


def run(a: argparse.Namespace) -> dict:
    import torch

    from megatron_fixedcode.training.arguments import parse_pretrain_args
    from megatron_fixedcode.training.loop import Trainer, _check_runtime

    prefix = make_data(Path(a.data_dir), num_tokens=200_000 if a.cpu_smoke else 2_000_000)
    argv = trainer_argv(a.variant, prefix, a.warmup + a.steps, a.micro_batch_size, a.global_batch_size)
    if a.cpu_smoke:  # the same path at toy size on CPU: FP32, local layers, no distributed optimizer
        argv += ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--ffn-hidden-size", "128",
                 "--num-query-groups", "4", "--seq-length", "64", "--micro-batch-size", "2", "--global-batch-size", "2",
                 "--transformer-impl", "local"]
    cfg = parse_pretrain_args(argv)
    if a.cpu_smoke:
        cfg.args.bf16 = False
        cfg.optim = dataclasses.replace(cfg.optim, use_distributed_optimizer=False)
    _check_runtime(cfg)
    t0 = time.perf_counter()
    trainer = Trainer(cfg)
    build_s = time.perf_counter() - t0
    losses, times = [], []
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for i in range(a.warmup + a.steps):
        sync()
        t = time.perf_counter()
        record = trainer.train_step()
        sync()
        times.append(time.perf_counter() - t)
        losses.append(record["loss"])
    args = cfg.args
    return summarize(
        variant=a.variant, gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        step_times=times[a.warmup:],
        tokens_per_step=trainer.global_batch * args.seq_length,
        flops_tok=model_flops_per_token(trainer.report, args.num_layers, args.hidden_size, args.seq_length),
        peak_alloc=torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0,
        peak_reserved=torch.cuda.max_memory_reserved() if torch.cuda.is_available() else 0,
        extra={"warmup_steps": a.warmup, "losses": losses, "build_s": build_s, "parameters": trainer.report,
               "transformer_impl": trainer.chunks[0].config.transformer_impl, "fp8": args.fp8_format,
               "optimizer": trainer.optimizer_kind, "micro_batch_size": args.micro_batch_size,
               "global_batch_size": trainer.global_batch, "seq_length": args.seq_length,
               "recompute_granularity": args.recompute_granularity, "bf16": args.bf16})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", choices=sorted(VARIANTS), default=None, help="required unless --check (then: all)")
    p.add_argument("--data-dir", default="bench-data")
    p.add_argument("--out", default=None, help="JSON result file (default: stdout only)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--global-batch-size", type=int, default=8)
    p.add_argument("--check", action="store_true", help="validate the trainer flags only (no GPU, no data)")
    p.add_argument("--cpu-smoke", action="store_true", help="run the same path at toy size on CPU (the dry run)")
    a = p.parse_args(argv)
    if a.check:
        from megatron_fixedcode.training.arguments import parse_pretrain_args

        for variant in [a.variant] if a.variant else sorted(VARIANTS):
            argv = trainer_argv(variant, "/nonexistent/random_text_document", a.warmup + a.steps,
                                a.micro_batch_size, a.global_batch_size)
            cfg = parse_pretrain_args([*argv, "--dry-run"])
            unexpanded = {k: v for k, v in cfg.as_dict().items() if "${" in str(v)}
            if unexpanded:
                raise SystemExit(f"{variant}: the recipe's placeholders are not overridden: {unexpanded}")
            print(json.dumps({"variant": variant, "trainer_argv": argv, "global_batch_size": cfg.args.global_batch_size,
                              "recompute_granularity": cfg.args.recompute_granularity, "bf16": cfg.args.bf16}))
        return 0
    if a.variant is None:
        p.error("--variant is required (unless --check)")
    result = run(a)
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("step_times_s", "losses", "parameters")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
