"""Throughput of the paper-2 block on one GPU with the real trainer (one variant per process).

    python scripts/gpu_check/bench.py --make-data --data-dir OUT/bench-data          # once (install stage)
    python scripts/gpu_check/bench.py --variant binary --data-dir OUT/bench-data --budget-s 42 --out OUT/bench-binary.json
    python scripts/gpu_check/bench.py --check                                        # CPU: only validate the trainer flags

The paper-2 recipe (h 2048, FFN 8192 SwiGLU, 32 heads, seq 2048, micro batch 8, BF16, distributed
optimizer, the recipe's recompute setting) at --num-layers 4 of its 24 blocks (so that build, warm-up and
steps fit a ~50 s stage), global batch 8: one micro batch, no accumulation. Variants: binary, gf2 and
learned with megatron-core's local layers; te (binary, Transformer Engine layers) and te_fp8 (plus FP8
hybrid, delayed scaling) where TE is importable. Data: random tokens (V = 49,152) in a Megatron index,
so the step time is the model's. The timed loop stops starting steps when the next one would end past
--budget-s (counted from the process start); at least one timed step is required. Reported: median
step time, tokens/s, model TFLOP/s and MFU, peak memory, and where every tensor was: the device of
each parameter and buffer of trainer.chunks after the steps, and of the batch tensors the model was
called with (a forward pre-hook). On CUDA, anything not on CUDA fails the run (exit 3).

Model FLOPs per token = 6·N + 12·L·h·s (models.report.model_flops_per_token), N = trainable parameters
that do matrix multiplies (blocks + output head; a learned input table is a lookup and is left out,
so learned and binary are credited the same work); recomputation is not credited (MFU, not hardware
FLOP utilization).
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

LOCAL = ["--transformer-impl", "local"]
TE = ["--transformer-impl", "transformer_engine"]
VARIANTS = {  # name -> (recipe input, extra trainer flags)
    "binary": ("binary", LOCAL),
    "gf2": ("gf2", LOCAL),
    "learned": ("learned", LOCAL),
    "te": ("binary", TE),
    "te_fp8": ("binary", [*TE, "--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--fp8-amax-history-len", "1024",
                          "--fp8-amax-compute-algo", "max"]),
}
START = time.perf_counter()
VOCAB = 49152


def trainer_argv(variant: str, data_prefix: str, num_steps: int, micro_batch: int, global_batch: int,
                 num_layers: int = 4) -> list[str]:
    recipe, extra = VARIANTS[variant]
    return ["--config", str(ROOT / f"examples/recipes/paper2_1p7b_{recipe}.yaml"), "--data-path", data_prefix,
            "--num-layers", str(num_layers),
            "--valid-data-path", data_prefix, "--tokenizer-model", "", "--dataset-type", "gpt",
            "--vocab-size", str(VOCAB), "--seed", "1234",
            "--micro-batch-size", str(micro_batch), "--global-batch-size", str(global_batch),
            "--train-iters", str(num_steps), "--lr-warmup-iters", "1", "--lr-decay-iters", "1000",
            "--log-interval", "1000", "--bf16", *extra]  # megatron's BF16 mode, as the recorded benchmarks ran


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


def placement(trainer, batch_devices: dict) -> dict:
    """Where the model's parameters and buffers (trainer.chunks) and the batch tensors it was called with are."""
    def count(named) -> dict:
        out: dict[str, int] = {}
        for _, t in named:
            out[str(t.device)] = out.get(str(t.device), 0) + 1
        return out

    params = [(n, p) for c in trainer.chunks for n, p in c.named_parameters()]
    buffers = [(n, b) for c in trainer.chunks for n, b in c.named_buffers()]
    off = [f"parameter {n} on {t.device}" for n, t in params if t.device.type != "cuda"]
    off += [f"buffer {n} on {t.device}" for n, t in buffers if t.device.type != "cuda"]
    off += [f"batch {n} on {d}" for n, d in batch_devices.items() if not d.startswith("cuda")]
    if not batch_devices:
        off.append("no batch tensor seen by the model")
    return {"parameters": count(params), "buffers": count(buffers), "batch": batch_devices,
            "all_on_cuda": not off, "not_on_cuda": off[:20]}


def run(a: argparse.Namespace) -> dict:
    import torch

    from megatron_fixedcode.training import checkpointing
    from megatron_fixedcode.training.arguments import parse_pretrain_args
    from megatron_fixedcode.training.runtime_checks import check_runtime
    from megatron_fixedcode.training.trainer import Trainer

    prefix = make_data(Path(a.data_dir), num_tokens=200_000 if a.cpu_smoke else 2_000_000)
    argv = trainer_argv(a.variant, prefix, a.warmup + a.steps, a.micro_batch_size, a.global_batch_size, a.num_layers)
    if a.cpu_smoke:  # the same path at toy size on CPU: FP32, local layers, no distributed optimizer
        argv += ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--ffn-hidden-size", "128",
                 "--num-query-groups", "4", "--seq-length", "64", "--micro-batch-size", "2", "--global-batch-size", "2",
                 "--transformer-impl", "local"]
    cfg = parse_pretrain_args(argv)
    if a.cpu_smoke:
        cfg.args.bf16, cfg.args.precision = False, "fp32"
        cfg.optim = dataclasses.replace(cfg.optim, use_distributed_optimizer=False)
    check_runtime(cfg)
    t0 = time.perf_counter()
    trainer = Trainer(cfg)
    build_s = time.perf_counter() - t0
    batch_devices: dict[str, str] = {}

    def record_batch(_module, args, kwargs):
        if not batch_devices:
            named = [(f"arg{i}", v) for i, v in enumerate(args)] + list(kwargs.items())
            batch_devices.update({n: str(v.device) for n, v in named if isinstance(v, torch.Tensor)})

    hooks = [checkpointing.unwrap(c).register_forward_pre_hook(record_batch, with_kwargs=True) for c in trainer.chunks]
    losses, times = [], []
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for i in range(a.warmup + a.steps):
        # Stop before a step that would end past the budget (the stage's timeout kills the process).
        if a.budget_s and i > a.warmup and time.perf_counter() - START + 1.5 * times[-1] > a.budget_s:
            break
        sync()
        t = time.perf_counter()
        record = trainer.train_step()
        sync()
        times.append(time.perf_counter() - t)
        losses.append(record["loss"])
    for h in hooks:
        h.remove()
    timed = times[a.warmup:] or times[-1:]
    args = cfg.args
    where = placement(trainer, batch_devices)
    return summarize(
        variant=a.variant, gpu=torch.cuda.get_device_name() if cuda else "cpu",
        step_times=timed,
        tokens_per_step=trainer.global_batch * args.seq_length,
        flops_tok=model_flops_per_token(trainer.report, args.num_layers, args.hidden_size, args.seq_length),
        peak_alloc=torch.cuda.max_memory_allocated() if cuda else 0,
        peak_reserved=torch.cuda.max_memory_reserved() if cuda else 0,
        extra={"warmup_steps": min(a.warmup, len(times)), "timed_steps": len(times) - min(a.warmup, len(times)),
               "first_step_s": times[0], "losses": losses, "build_s": build_s, "wall_s": time.perf_counter() - START,
               "parameters": trainer.report, "num_layers": args.num_layers, "hidden_size": args.hidden_size,
               "transformer_impl": trainer.chunks[0].config.transformer_impl, "fp8": args.fp8_format,
               "optimizer": trainer.optimizer_kind, "micro_batch_size": args.micro_batch_size,
               "global_batch_size": trainer.global_batch, "seq_length": args.seq_length,
               "recompute_granularity": args.recompute_granularity, "bf16": args.bf16, "placement": where})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", choices=list(VARIANTS), default=None, help="required unless --check (then: all)")
    p.add_argument("--data-dir", default="bench-data")
    p.add_argument("--out", default=None, help="JSON result file (default: stdout only)")
    p.add_argument("--num-layers", type=int, default=4, help="blocks of the paper-2 recipe's 24 (default 4)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=10, help="timed steps at most (fewer when --budget-s runs out)")
    p.add_argument("--budget-s", type=float, default=0, help="stop starting steps that would end past this many "
                   "seconds after the process start (0: no limit)")
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--global-batch-size", type=int, default=8)
    p.add_argument("--make-data", action="store_true", help="only write the random-token data under --data-dir")
    p.add_argument("--check", action="store_true", help="validate the trainer flags only (no GPU, no data)")
    p.add_argument("--cpu-smoke", action="store_true", help="run the same path at toy size on CPU (the dry run)")
    a = p.parse_args(argv)
    if a.make_data:  # also the install stage's import check
        import megatron.core  # noqa: F401
        import psutil  # noqa: F401
        import pytest  # noqa: F401
        import yaml  # noqa: F401

        print(make_data(Path(a.data_dir)))
        return 0
    if a.check:
        from megatron_fixedcode.training.arguments import parse_pretrain_args

        for variant in [a.variant] if a.variant else list(VARIANTS):
            argv = trainer_argv(variant, "/nonexistent/random_text_document", a.warmup + a.steps,
                                a.micro_batch_size, a.global_batch_size, a.num_layers)
            cfg = parse_pretrain_args([*argv, "--dry-run"])
            unexpanded = {k: v for k, v in cfg.as_dict().items() if "${" in str(v)}
            if unexpanded:
                raise SystemExit(f"{variant}: the recipe's placeholders are not overridden: {unexpanded}")
            print(json.dumps({"variant": variant, "trainer_argv": argv, "global_batch_size": cfg.args.global_batch_size,
                              "num_layers": cfg.args.num_layers, "transformer_impl": cfg.args.transformer_impl,
                              "recompute_granularity": cfg.args.recompute_granularity, "bf16": cfg.args.bf16}))
        return 0
    if a.variant is None:
        p.error("--variant is required (unless --check)")
    result = run(a)
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("step_times_s", "losses", "parameters", "placement")}))
    where = result["placement"]
    print(f"placement: parameters {where['parameters']}, buffers {where['buffers']}, batch {where['batch']}")
    if result["timed_steps"] < 1:
        print("error: no timed step within --budget-s", file=sys.stderr)
        return 4
    import torch

    if torch.cuda.is_available() and not where["all_on_cuda"]:
        print(f"error: not on CUDA: {'; '.join(where['not_on_cuda'])}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
