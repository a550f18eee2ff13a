"""A dry run on a login node: TE is a warning, and the layout, microbatches and per-GPU memory
come out with the arithmetic of docs/SCALING.md (whose paper-2 table these figures reproduce)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

from megatron_fixedcode.arguments.memory_estimate import GB, plan
from megatron_fixedcode.arguments.parse import parse_pretrain_args
from megatron_fixedcode.utils.te_install import TE_INSTALL_HINT
from tests.helpers import REPO

HAS_TE = importlib.util.find_spec("transformer_engine") is not None


def _args(recipe: str, *flags: str):
    return parse_pretrain_args(
        ["--config", str(REPO / "examples" / "recipes" / recipe), "--dry-run", "--vocab-size", "49152", *flags]
    ).args


@pytest.mark.parametrize(
    "recipe, world, precision, total_gb, state_gb",
    [
        ("paper2_1p7b_binary.yaml", 16, "bf16", 54.8, 11.6),
        ("paper2_1p7b_binary.yaml", 8, "bf16", 56.1, 12.8),
        ("paper2_1p7b_learned.yaml", 16, "bf16", 55.5, 12.2),
        ("paper2_1p7b_learned.yaml", 8, "bf16", 56.9, 13.6),
        # the recipes' own mode: fp32 weight + grad + the bf16 casts kept for backward, fp32 norm inputs
        ("paper2_1p7b_binary.yaml", 16, "fp32-autocast-bf16", 64.5, 18.0),
        ("paper2_1p7b_learned.yaml", 8, "fp32-autocast-bf16", 66.4, 19.9),
    ],
)
def test_paper2_memory_matches_scaling_doc(recipe, world, precision, total_gb, state_gb):
    p = plan(_args(recipe, "--precision", precision), world)
    assert (p["dp"], p["microbatches"]) == (world, 128 // (8 * world))
    assert round(p["bytes"]["total"] / GB, 1) == total_gb
    assert round(p["bytes"]["weights_grads_optimizer"] / GB, 1) == state_gb


def test_full_recompute_and_no_distributed_optimizer():
    assert (
        round(
            plan(
                _args(
                    "paper2_1p7b_binary.yaml",
                    "--recompute-granularity",
                    "full",
                    "--recompute-method",
                    "uniform",
                    "--recompute-num-layers",
                    "1",
                    "--bf16",
                ),
                16,
            )["bytes"]["total"]
            / GB,
            1,
        )
        == 25.6
    )
    assert (
        round(
            plan(
                _args(
                    "paper2_1p7b_binary.yaml",
                    "--recompute-granularity",
                    "full",
                    "--recompute-method",
                    "uniform",
                    "--recompute-num-layers",
                    "1",
                ),
                16,
            )["bytes"]["total"]
            / GB,
            1,
        )
        == 32.1
    )
    a = _args("paper2_1p7b_binary.yaml", "--bf16")
    a.use_distributed_optimizer = False
    assert round(plan(a, 16)["bytes"]["total"] / GB, 1) == 74.1


def test_layout_that_does_not_divide_is_refused():
    with pytest.raises(ValueError, match="not a multiple of TP x PP x CP = 2"):
        plan(_args("paper2_1p7b_binary.yaml", "--tensor-model-parallel-size", "2"), 15)
    with pytest.raises(ValueError, match="global batch 128 is not divisible by micro batch 8 x data-parallel size 32"):
        plan(_args("paper2_1p7b_binary.yaml"), 32)


def test_dry_run_prints_plan_and_te_warning():
    env = {
        **os.environ,
        "WORLD_SIZE": "16",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "megatron_fixedcode.pretrain",
            "--config",
            "examples/recipes/paper2_1p7b_binary.yaml",
            "--vocab-size",
            "49152",
            "--fp8-format",
            "hybrid",
            "--bf16",
            "--dry-run",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["fp8"] == "hybrid"  # stdout stays the config alone
    err = proc.stderr.splitlines()
    warned = [line for line in err if line.startswith("warning:")]
    assert warned == (
        []
        if HAS_TE
        else [
            "warning: this run asks for Transformer Engine (--transformer-impl transformer_engine, --fp8-format hybrid), "
            f"which is not installed here: the compute nodes will need it ({TE_INSTALL_HINT})"
        ]
    )
    assert (
        "dry run: 16 GPUs = TP 1 x PP 1 x CP 1 x DP 16; global batch 128 = micro batch 8 x 1 microbatches x DP 16"
        in err
    )
    assert any(line.startswith("dry run: memory per GPU") and line.endswith("~54.8 GB") for line in err), err


def test_gpt2_block_counts_the_tied_table_once_and_the_position_table():
    """Megatron-LM's default block: the tied head is the input table (one V x h, a copy on the last stage
    with PP > 1) and learned positions add max-position-embeddings x h."""
    base = [
        "--num-layers",
        "4",
        "--hidden-size",
        "256",
        "--num-attention-heads",
        "8",
        "--seq-length",
        "512",
        "--lr",
        "1e-3",
        "--train-iters",
        "10",
        "--vocab-size",
        "1000",
        "--transformer-impl",
        "local",
    ]
    parse = lambda *f: parse_pretrain_args([*base, *f, "--dry-run"]).args  # noqa: E731
    untied = plan(parse("--untie-embeddings-and-output-weights", "--position-embedding-type", "rope"), 1)
    tied = plan(parse("--position-embedding-type", "rope"), 1)
    positions = plan(parse("--max-position-embeddings", "2048"), 1)
    padded = 1024  # 1000 rounded up to 128
    assert untied["parameters"] - tied["parameters"] == padded * 256
    assert untied["parameters_per_gpu"] - tied["parameters_per_gpu"] == padded * 256
    assert positions["parameters"] - tied["parameters"] == 2048 * 256
    tied_pp2 = plan(parse("--position-embedding-type", "rope", "--pipeline-model-parallel-size", "2"), 2)
    assert tied_pp2["parameters"] == tied["parameters"]  # the last stage's copy is not another parameter


@pytest.mark.parametrize(
    "flags",
    [
        [],  # Megatron-LM's defaults: LayerNorm, GELU, linear biases, learned positions, tied head
        ["--untie-embeddings-and-output-weights", "--position-embedding-type", "rope", "--qk-layernorm"],
        ["--block", "llama", "--group-query-attention", "--num-query-groups", "2", "--input-embedding", "binary"],
        [
            "--normalization",
            "RMSNorm",
            "--swiglu",
            "--add-qkv-bias",
            "--disable-bias-linear",
            "--kv-channels",
            "48",
            "--position-embedding-type",
            "rope",
            "--untie-embeddings-and-output-weights",
        ],
        [
            "--squared-relu",
            "--qk-layernorm",
            "--input-embedding",
            "binary",
            "--position-embedding-type",
            "rope",
            "--untie-embeddings-and-output-weights",
        ],
    ],
    ids=["gpt2", "untied-qknorm", "llama-gqa-binary", "rmsnorm-swiglu-qkvbias", "squared-relu-binary"],
)
def test_dry_run_parameter_count_equals_the_built_model(single_rank, flags):
    """The dry run's parameter count is the model's: every bias, norm and table megatron-core builds."""
    from megatron_fixedcode.checkpoint.single_process import build_single_rank_model

    parsed = parse_pretrain_args(
        [
            "--num-layers",
            "2",
            "--hidden-size",
            "128",
            "--num-attention-heads",
            "4",
            "--ffn-hidden-size",
            "320",
            "--seq-length",
            "64",
            "--max-position-embeddings",
            "96",
            "--lr",
            "1e-3",
            "--train-iters",
            "10",
            "--vocab-size",
            "1000",
            "--transformer-impl",
            "local",
            *flags,
            "--dry-run",
        ]
    )
    model = build_single_rank_model(parsed.model_config(1000))
    assert plan(parsed.args, 1)["parameters"] == sum(p.numel() for p in model.parameters())


def test_dry_run_suggests_young_dalys_checkpoint_interval():
    """The 1.7B recipe at 16 and 128 GPUs: its checkpoint (16 B per parameter) shared over the ranks at an assumed
    1 GB/s each, the Llama 3 failure rate, and the interval sqrt(2 x save x MTBF), in minutes."""
    from megatron_fixedcode.arguments.memory_estimate import checkpoint_cadence

    a = _args("paper2_1p7b_binary.yaml", "--micro-batch-size", "1")
    for world in (16, 128):
        p = plan(a, world)
        line = checkpoint_cadence(p, a)
        ckpt = 16 * p["parameters"] * 1.01 + (1 << 20)  # save_checks' bytes per parameter and overhead
        mtbf = 3600 / (world * 419 / (54 * 24 * 16384))
        minutes = math.sqrt(2 * ckpt / world / 1e9 * mtbf) / 60
        assert f"a {world}-GPU job fails every ~{mtbf / 86400:.1f} days" in line, line
        assert f"checkpoint every ~{minutes:.0f} min (Young/Daly)" in line, line
