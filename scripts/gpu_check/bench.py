"""Throughput of the paper-2 recipe's block on one GPU with the real trainer (one variant per process).

    python scripts/gpu_check/bench.py --make-data --data-dir OUT/bench-data          # once (install stage)
    python scripts/gpu_check/bench.py --variant binary --data-dir OUT/bench-data --budget-s 32 --out OUT/bench-binary.json
    python scripts/gpu_check/bench.py --variant binary --warm --data-dir ...         # compile stage: 1 layer, 1 step
    python scripts/gpu_check/bench.py --check                                        # CPU: only validate the trainer flags

The paper-2 recipe as written (examples/recipes/paper2_1p7b_<code>.yaml: h 2048, FFN 8192 SwiGLU,
32 heads, seq 2048, micro batch 8, `precision: fp32-autocast-bf16`, the distributed optimizer with
its overlap flags, the recipe's recompute setting: none), with three changes that a bare one-GPU
machine forces: --num-layers 4 of its 24 blocks (so that build, warm-up and steps fit a 40 s stage;
the report projects 24 layers at the same MFU), global batch 8 (one micro batch, no accumulation)
and megatron-core's local layers (Transformer Engine cannot travel to the machine: its wheels are
far over the 64 MiB carry). The GPU fusions stay on (Megatron-LM's defaults: torch.compile'd
SwiGLU and bias-dropout-add) unless --no-compile-fusions. Variants: binary, gf2 and learned in the
recipe's precision; binary_bf16 with `--bf16` (megatron's BF16 mode); te and te_fp8 (--bf16, TE
layers, FP8 hybrid) only where TE is already importable. Data: random tokens (V = 49,152) in a
Megatron index, so the step time is the model's. The timed loop stops starting steps when the next
one would end past --budget-s (counted from the process start); at least one timed step is
required. Reported: median step time, tokens/s, model TFLOP/s and MFU, peak memory, the first
step's time (the compile), and where every tensor was: the device of each parameter and buffer of
trainer.chunks after the steps, and of the batch tensors the model was called with (a forward
pre-hook). On CUDA, anything not on CUDA fails the run (exit 3).

Model FLOPs per token = 6·N + 12·L·h·s (models.cost.model_flops_per_token), N = trainable parameters
that do matrix multiplies (blocks + output head; a learned input table is a lookup and is left out,
so learned and binary are credited the same work); recomputation is not credited (MFU, not hardware
FLOP utilization). MFU = model FLOP/s over the GPU's dense BF16 peak (training.metrics: 989.4 TFLOP/s
for H100/H200 SXM, the datasheet's 1,979 with sparsity halved), also for fp32-autocast-bf16, whose
matmuls run in BF16.

--cpu-standin: the same command at toy size on CPU (2 layers of h 64, seq 64, gloo), precision,
distributed optimizer and overlap kept: how the CPU test runs every stage's command line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from megatron_fixedcode.models.cost import model_flops_per_token  # noqa: E402
from megatron_fixedcode.training.metrics import device_peak_flops  # noqa: E402

LOCAL = ["--transformer-impl", "local"]
TE = ["--transformer-impl", "transformer_engine"]
BF16 = ["--bf16"]  # megatron's BF16 mode; without it: the recipe's fp32-autocast-bf16
VARIANTS = {  # name -> (recipe input, extra trainer flags)
    "binary": ("binary", LOCAL),
    "gf2": ("gf2", LOCAL),
    "learned": ("learned", LOCAL),
    "binary_bf16": ("binary", [*BF16, *LOCAL]),
    "te": ("binary", [*BF16, *TE]),
    "te_autocast": ("binary", TE),  # the recipe's exact path: TE layers under fp32-autocast-bf16
    "te_fp8": (
        "binary",
        [
            *BF16,
            *TE,
            "--fp8-format",
            "hybrid",
            "--fp8-recipe",
            "delayed",
            "--fp8-amax-history-len",
            "1024",
            "--fp8-amax-compute-algo",
            "max",
        ],
    ),
}
# torch.compile'd by megatron-core (megatron/core/jit.py): off where this machine cannot compile (no C
# compiler or Python.h, or the compile stage failed), with Megatron-LM's own flags.
NO_COMPILE_FUSIONS = ["--no-bias-swiglu-fusion", "--no-bias-dropout-fusion"]
# --cpu-standin: toy sizes on CPU; everything else (precision, optimizer, overlap, fusion flags) as on the GPU
CPU_STANDIN = [
    "--num-layers",
    "2",
    "--hidden-size",
    "64",
    "--num-attention-heads",
    "4",
    "--ffn-hidden-size",
    "128",
    "--num-query-groups",
    "4",
    "--seq-length",
    "64",
    "--micro-batch-size",
    "2",
    "--global-batch-size",
    "2",
    "--vocab-size",
    "1024",
    "--make-vocab-size-divisible-by",
    "8",
    "--code-kernel",
    "torch",
]
STANDIN_VOCAB = 1024
RECIPE_LAYERS = 24
START = time.perf_counter()
VOCAB = 49152


def trainer_argv(
    variant: str,
    data_prefix: str,
    num_steps: int,
    micro_batch: int = 8,
    global_batch: int = 8,
    num_layers: int = 4,
    *,
    compile_fusions: bool = True,
    cpu_standin: bool = False,
) -> list[str]:
    """The trainer's command line for one variant (bench.py and ckpt_roundtrip.py build theirs here)."""
    recipe, extra = VARIANTS[variant]
    return [
        "--config",
        str(ROOT / f"examples/recipes/paper2_1p7b_{recipe}.yaml"),
        "--train-data-path",
        data_prefix,
        "--num-layers",
        str(num_layers),
        "--valid-data-path",
        data_prefix,
        "--tokenizer-model",
        "",
        "--dataset-type",
        "gpt",
        "--vocab-size",
        str(VOCAB),
        "--seed",
        "1234",
        "--micro-batch-size",
        str(micro_batch),
        "--global-batch-size",
        str(global_batch),
        "--train-iters",
        str(num_steps),
        "--lr-warmup-iters",
        "1",
        "--lr-decay-iters",
        "1000",
        "--log-interval",
        "1000",
        *extra,
        *([] if compile_fusions else NO_COMPILE_FUSIONS),
        *(CPU_STANDIN if cpu_standin else []),
    ]


def make_data(data_dir: Path, num_tokens: int = 2_000_000, vocab: int = VOCAB) -> str:
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
        builder.add_item(torch.from_numpy(rng.integers(0, vocab, 4096, dtype=np.int64)))
        builder.end_document()
    builder.finalize(f"{prefix}.idx")
    Path(f"{prefix}.bin.tmp").rename(f"{prefix}.bin")
    return str(prefix)


def summarize(
    *,
    variant: str,
    gpu: str,
    step_times: list[float],
    tokens_per_step: int,
    flops_tok: float,
    peak_alloc: int,
    peak_reserved: int,
    extra: dict,
) -> dict:
    """The numbers the report shows (also used on fake inputs by the dry run)."""
    step_s = statistics.median(step_times)
    tokens_s = tokens_per_step / step_s
    tflops = tokens_s * flops_tok / 1e12
    peak = device_peak_flops(gpu)
    return {
        "variant": variant,
        "gpu": gpu,
        "step_time_s": step_s,
        "step_times_s": step_times,
        "tokens_per_step": tokens_per_step,
        "tokens_per_s": tokens_s,
        "model_flops_per_token": flops_tok,
        "model_tflops_per_s": tflops,
        "mfu": tflops * 1e12 / peak if peak else None,
        "peak_bf16_tflops": peak / 1e12 if peak else None,
        "peak_memory_allocated_gib": peak_alloc / 2**30,
        "peak_memory_reserved_gib": peak_reserved / 2**30,
        # not measured: the recipe's 24 layers at this MFU (the same model FLOP/s over more FLOPs per token)
        "tokens_per_s_24_layers_at_this_mfu": (
            tokens_s * flops_tok / extra["model_flops_per_token_24_layers"]
            if extra.get("model_flops_per_token_24_layers")
            else None
        ),
        **extra,
    }


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
    return {
        "parameters": count(params),
        "buffers": count(buffers),
        "batch": batch_devices,
        "all_on_cuda": not off,
        "not_on_cuda": off[:20],
    }


def run(a: argparse.Namespace) -> dict:
    import torch

    from megatron_fixedcode import checkpoint
    from megatron_fixedcode.arguments.parse import parse_pretrain_args
    from megatron_fixedcode.training.runtime_checks import check_runtime
    from megatron_fixedcode.training.trainer import Trainer

    prefix = make_data(Path(a.data_dir), *((100_000, STANDIN_VOCAB) if a.cpu_standin else ()))
    if a.warm:  # the compile stage: the same shapes and dtypes at one layer, one step
        a.num_layers, a.warmup, a.steps = 1, 1, 0
    argv = trainer_argv(
        a.variant,
        prefix,
        a.warmup + a.steps,
        a.micro_batch_size,
        a.global_batch_size,
        a.num_layers,
        compile_fusions=not a.no_compile_fusions,
        cpu_standin=a.cpu_standin,
    )
    print("trainer flags: " + " ".join(argv), flush=True)
    cfg = parse_pretrain_args(argv)
    check_runtime(cfg)
    t0 = time.perf_counter()
    trainer = Trainer(cfg)
    build_s = time.perf_counter() - t0
    batch_devices: dict[str, str] = {}

    def record_batch(_module, args, kwargs):
        if not batch_devices:
            named = [(f"arg{i}", v) for i, v in enumerate(args)] + list(kwargs.items())
            batch_devices.update({n: str(v.device) for n, v in named if isinstance(v, torch.Tensor)})

    hooks = [checkpoint.unwrap(c).register_forward_pre_hook(record_batch, with_kwargs=True) for c in trainer.chunks]
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
    from megatron_fixedcode.compat.distributed import destroy_distributed

    destroy_distributed()  # as the trainer CLI does (NCCL warns at exit otherwise)
    timed = times[a.warmup :] or times[-1:]
    model, perf = trainer.model_cfg, cfg.performance  # the typed configs, as the trainer reads them
    flops_tok = model_flops_per_token(trainer.report, model.num_layers, model.hidden_size, model.seq_length)
    # the recipe's 24 layers: the same per-block work for the blocks left out (MFU projection only)
    block = checkpoint.unwrap(trainer.chunks[0]).decoder.layers[0]
    per_block = sum(p.numel() for p in block.parameters() if p.requires_grad)
    flops_recipe = flops_tok + (RECIPE_LAYERS - model.num_layers) * (
        6 * per_block + 12 * model.hidden_size * model.seq_length
    )
    where = placement(trainer, batch_devices)
    return summarize(
        variant=a.variant,
        gpu=torch.cuda.get_device_name() if cuda else "cpu",
        step_times=timed,
        tokens_per_step=trainer.global_batch * model.seq_length,
        flops_tok=flops_tok,
        peak_alloc=torch.cuda.max_memory_allocated() if cuda else 0,
        peak_reserved=torch.cuda.max_memory_reserved() if cuda else 0,
        extra={
            "warmup_steps": min(a.warmup, len(times)),
            "timed_steps": len(times) - min(a.warmup, len(times)),
            "first_step_s": times[0],
            "losses": losses,
            "precision": perf.precision,
            "trainer_argv": argv,
            "fusions": dict(trainer.fusions),
            "compile_fusions": not a.no_compile_fusions,
            "warm": a.warm,
            "model_flops_per_token_24_layers": flops_recipe,
            "build_s": build_s,
            "wall_s": time.perf_counter() - START,
            "parameters": trainer.report,
            "num_layers": model.num_layers,
            "hidden_size": model.hidden_size,
            "ffn_hidden_size": model.ffn_hidden_size,
            "num_attention_heads": model.num_attention_heads,
            "transformer_impl": trainer.chunks[0].config.transformer_impl,
            "fp8": perf.fp8,
            "optimizer": trainer.optimizer_kind,
            "micro_batch_size": cfg.schedule.micro_batch_size,
            "global_batch_size": trainer.global_batch,
            "seq_length": model.seq_length,
            "recompute_granularity": model.recompute_granularity,
            "bf16": perf.bf16,
            "placement": where,
        },
    )


def warm_in_parallel(a: argparse.Namespace) -> int:
    """The compile stage: one --warm process per variant, at once (they share the inductor cache);
    each one's output in OUT/compile-<variant>.log, its result in compile-<variant>.json."""
    import subprocess

    out = Path(a.out or ".").parent
    rest = [
        "--warm",
        "--data-dir",
        a.data_dir,
        *(["--cpu-standin"] if a.cpu_standin else []),
        *(["--no-compile-fusions"] if a.no_compile_fusions else []),
    ]
    procs = {}
    for variant in a.variant.split(","):
        log = open(out / f"compile-{variant}.log", "w")
        cmd = [sys.executable, __file__, *rest, "--variant", variant, "--out", str(out / f"compile-{variant}.json")]
        procs[variant] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log)
    failed = []
    for variant, (proc, log) in procs.items():
        rc = proc.wait()
        log.close()
        first = json.loads((out / f"compile-{variant}.json").read_text()).get("first_step_s") if rc == 0 else None
        print(
            f"{variant}: "
            + (
                f"first step (build + compile) {first:.1f} s"
                if rc == 0
                else f"exit {rc} (compile-{variant}.log): " + _last_line(out / f"compile-{variant}.log")
            )
        )
        failed += [variant] if rc else []
    return 1 if failed else 0


def _last_line(path: Path) -> str:
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()] if path.exists() else []
    return lines[-1][:300] if lines else "(no output)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--variant",
        default=None,
        help=f"one of {', '.join(VARIANTS)}; required unless --check (then: all); "
        "with --warm a comma-separated list, run at once",
    )
    p.add_argument("--data-dir", default="bench-data")
    p.add_argument("--out", default=None, help="JSON result file (default: stdout only)")
    p.add_argument("--num-layers", type=int, default=4, help="blocks of the paper-2 recipe's 24 (default 4)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=10, help="timed steps at most (fewer when --budget-s runs out)")
    p.add_argument(
        "--budget-s",
        type=float,
        default=0,
        help="stop starting steps that would end past this many seconds after the process start (0: no limit)",
    )
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--global-batch-size", type=int, default=8)
    p.add_argument("--make-data", action="store_true", help="only write the random-token data under --data-dir")
    p.add_argument("--check", action="store_true", help="validate the trainer flags only (no GPU, no data)")
    p.add_argument(
        "--cpu-standin", action="store_true", help="the same command at toy size on CPU (the dry run, the CPU test)"
    )
    p.add_argument("--warm", action="store_true", help="the compile stage: 1 layer, 1 step, no timing required")
    p.add_argument(
        "--no-compile-fusions",
        action="store_true",
        help="turn the torch.compile'd fusions off: " + " ".join(NO_COMPILE_FUSIONS),
    )
    a = p.parse_args(argv)
    if a.make_data:  # also the install stage's import check
        import megatron.core  # noqa: F401
        import psutil  # noqa: F401
        import pytest  # noqa: F401
        import yaml  # noqa: F401

        print(make_data(Path(a.data_dir), *((100_000, STANDIN_VOCAB) if a.cpu_standin else ())))
        return 0
    if a.check:
        from megatron_fixedcode.arguments.parse import parse_pretrain_args

        for variant in [a.variant] if a.variant else list(VARIANTS):
            argv = trainer_argv(
                variant,
                "/nonexistent/random_text_document",
                a.warmup + a.steps,
                a.micro_batch_size,
                a.global_batch_size,
                a.num_layers,
                compile_fusions=not a.no_compile_fusions,
                cpu_standin=a.cpu_standin,
            )
            cfg = parse_pretrain_args([*argv, "--dry-run"])
            model = cfg.model_config(cfg.tokenizer.vocab_size)  # as the trainer builds it (--vocab-size given)
            unexpanded = {k: v for k, v in cfg.as_dict().items() if "${" in str(v)}
            if variant not in VARIANTS:
                p.error(f"--variant {variant}: choose one of {', '.join(VARIANTS)}")
            if unexpanded:
                raise SystemExit(f"{variant}: the recipe's placeholders are not overridden: {unexpanded}")
            print(
                json.dumps(
                    {
                        "variant": variant,
                        "trainer_argv": argv,
                        "global_batch_size": cfg.schedule.global_batch_size,
                        "num_layers": model.num_layers,
                        "transformer_impl": cfg.performance.transformer_impl,
                        "recompute_granularity": model.recompute_granularity,
                        "precision": cfg.performance.precision,
                        "use_distributed_optimizer": cfg.optim.use_distributed_optimizer,
                    }
                )
            )
        return 0
    if a.variant is None:
        p.error("--variant is required (unless --check)")
    unknown = [v for v in a.variant.split(",") if v not in VARIANTS] + (
        [a.variant] if "," in a.variant and not a.warm else []
    )
    if unknown:
        p.error(
            f"--variant {a.variant}: choose one of {', '.join(VARIANTS)} (several, comma-separated, only with --warm)"
        )
    if a.warm and "," in a.variant:
        return warm_in_parallel(a)
    result = run(a)
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
    print(
        json.dumps(
            {
                k: v
                for k, v in result.items()
                if k not in ("step_times_s", "losses", "parameters", "placement", "trainer_argv")
            }
        )
    )
    where = result["placement"]
    print(f"placement: parameters {where['parameters']}, buffers {where['buffers']}, batch {where['batch']}")
    mfu = f"{100 * result['mfu']:.1f}%" if result["mfu"] else "— (no peak known for this device)"
    print(
        f"summary: {a.variant} {result['precision']}: {result['num_layers']} layers, {result['timed_steps']} timed steps, "
        f"{result['tokens_per_s']:,.0f} tokens/s, MFU {mfu}, peak {result['peak_memory_allocated_gib']:.1f} GiB "
        f"allocated, first step {result['first_step_s']:.1f} s, "
        f"placement {'all on CUDA' if where['all_on_cuda'] else 'NOT all on CUDA'}"
    )
    if result["timed_steps"] < 1 and not a.warm:
        print("error: no timed step within --budget-s", file=sys.stderr)
        return 4
    import torch

    if torch.cuda.is_available() and not where["all_on_cuda"]:
        print(f"error: not on CUDA: {'; '.join(where['not_on_cuda'])}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
