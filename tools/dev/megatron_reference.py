"""Megatron-LM's own parser as the reference for this trainer's command line.

Writes ``tests/assets/megatron_reference.json``: for many dense-GPT argument lists, the values that
Megatron-LM's ``parse_args`` + ``validate_args`` (``megatron/training/arguments.py`` of the tree given)
give the dests this trainer's ``--dry-run`` prints. ``tests/arguments/test_megatron_reference.py`` compares them
dest by dest; the differences it allows are ``DIFFERENT`` there, each with its reason. Nothing of
Megatron-LM's code is copied: its parser runs in a subprocess and only the resulting values are stored.

    git -C MIRROR archive core_v0.16.1 megatron examples tests/functional_tests/test_cases/gpt | tar -x -C /tmp/mlm016
    python tools/dev/megatron_reference.py --megatron /tmp/mlm016 --tag core_v0.16.1   # py3.11 venv (mcore 0.16.1)
    # the flags a later tree adds (arguments/added_after_core_016.py), with the interpreter that imports that tree (py3.12 venv):
    python tools/dev/megatron_reference.py --megatron /tmp/mlm019 --added-since /tmp/mlm016 --python PY312

The argument lists (``collect_cases``): the two of tests/training/test_megatron_cli.py (Megatron's Llama-3 8B
FP8 and GPT-3 175B examples, shrunk); every dense model's ``MODEL_ARGS`` of
``examples/post_training/modelopt/conf``; every dense training case of
``tests/functional_tests/test_cases/gpt/*/model_config.yaml``; and :data:`FAMILIES`, which sets every
flag family this trainer accepts away from its default. Each list is made runnable here the way a user
would (``adapt``): the flags this trainer refuses as outside its scope, or at a value other than
Megatron's default (``default_only_flags.AT_MEGATRON_DEFAULT_ONLY``), are dropped (the test checks that each is refused
in one line); a list without a tokenizer (neither ``--tokenizer-type`` nor a GPT-2 BPE ``--vocab-file``)
gets ``--tokenizer-type NullTokenizer --vocab-size 50257``; a list without ``--lr`` or a run length
gets ``--lr 1e-4 --train-iters 100``. Megatron runs on exactly the list that results, with
``WORLD_SIZE`` 8.

CPU stand-ins, the only ones: ``megatron.training``'s ``__init__`` is not run (it imports the training
loop, which needs triton), only ``global_vars``; ``get_device_arch_version`` answers 9 (Hopper); and
``CUDA_DEVICE_MAX_CONNECTIONS=1`` and ``NCCL_ALGO=Ring`` are set, which ``validate_args`` asks of
TP/CP runs and of ``--deterministic-mode``. Values are those after ``validate_args``:
``megatron_defaults`` holds the parser's defaults, each list's ``megatron`` only the dests that differ
from them (``"__absent__"``: deleted by validate_args, as ``recompute_activations``; ``__error__``:
Megatron-LM's parser refuses the list). ``megatron_flags`` lists every option string of its parser.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

WORLD_SIZE = 8
OUT = REPO / "tests" / "assets" / "megatron_reference.json"
# Megatron's values that its validate_args derives and this trainer's dry run prints too.
DERIVED = (
    "data_parallel_size",
    "world_size",
    "virtual_pipeline_model_parallel_size",
    "kv_channels",
    "ffn_hidden_size",
    "global_batch_size",
    "encoder_num_layers",
    "encoder_seq_length",
)
# Functional-test directories that are not dense GPT pretraining (inference, RL, MoE/MLA/linear attention, export).
NOT_DENSE = ("inference", "grpo", "_mla", "_gdn", "modelopt", "etp4")

# Every flag family accepted here, set away from Megatron's default (sizes small; world size 8).
FAMILIES = {
    "families_architecture": [
        "--num-layers",
        "4",
        "--hidden-size",
        "256",
        "--num-attention-heads",
        "8",
        "--seq-length",
        "512",
        "--max-position-embeddings",
        "1024",
        "--normalization",
        "RMSNorm",
        "--swiglu",
        "--disable-bias-linear",
        "--position-embedding-type",
        "rope",
        "--untie-embeddings-and-output-weights",
        "--group-query-attention",
        "--num-query-groups",
        "2",
        "--kv-channels",
        "64",
        "--rotary-percent",
        "0.5",
        "--rotary-base",
        "500000",
        "--norm-epsilon",
        "1e-6",
        "--init-method-std",
        "0.01",
        "--attention-dropout",
        "0.0",
        "--hidden-dropout",
        "0.05",
        "--make-vocab-size-divisible-by",
        "64",
        "--vocab-size",
        "32000",
        "--tokenizer-type",
        "NullTokenizer",
        "--micro-batch-size",
        "2",
        "--train-iters",
        "100",
        "--lr",
        "1e-3",
        "--qk-layernorm",
        "--add-qkv-bias",
        "--use-rope-scaling",
        "--rope-scaling-factor",
        "16",
    ],
    # Megatron-LM's default GPT-2 block (tied table, biases, learned positions) with a squared-ReLU MLP
    "families_gpt2_block": [
        "--num-layers",
        "4",
        "--hidden-size",
        "256",
        "--num-attention-heads",
        "8",
        "--seq-length",
        "512",
        "--max-position-embeddings",
        "1024",
        "--squared-relu",
        "--vocab-size",
        "32000",
        "--tokenizer-type",
        "NullTokenizer",
        "--micro-batch-size",
        "2",
        "--train-iters",
        "100",
        "--lr",
        "1e-3",
        "--async-save",
    ],
    "families_schedule_samples": [
        "--num-layers",
        "2",
        "--hidden-size",
        "128",
        "--num-attention-heads",
        "4",
        "--seq-length",
        "256",
        "--max-position-embeddings",
        "256",
        "--untie-embeddings-and-output-weights",
        "--disable-bias-linear",
        "--use-rotary-position-embeddings",
        "--vocab-size",
        "1000",
        "--tokenizer-type",
        "NullTokenizer",
        "--micro-batch-size",
        "1",
        "--global-batch-size",
        "16",
        "--train-samples",
        "16000",
        "--lr-decay-samples",
        "12000",
        "--lr-warmup-fraction",
        "0.05",
        "--lr-warmup-init",
        "1e-6",
        "--lr",
        "3e-4",
        "--min-lr",
        "3e-5",
        "--lr-decay-style",
        "cosine",
        "--weight-decay",
        "0.1",
        "--adam-beta1",
        "0.85",
        "--adam-beta2",
        "0.95",
        "--adam-eps",
        "1e-6",
        "--clip-grad",
        "0.5",
        "--seed",
        "7",
        "--bf16",
        "--override-opt_param-scheduler",
        "--no-check-for-nan-in-loss-and-grad",
    ],
    "families_parallel": [
        "--num-layers",
        "8",
        "--hidden-size",
        "256",
        "--num-attention-heads",
        "8",
        "--seq-length",
        "512",
        "--max-position-embeddings",
        "512",
        "--untie-embeddings-and-output-weights",
        "--disable-bias-linear",
        "--position-embedding-type",
        "rope",
        "--swiglu",
        "--vocab-size",
        "1000",
        "--tokenizer-type",
        "NullTokenizer",
        "--tensor-model-parallel-size",
        "2",
        "--pipeline-model-parallel-size",
        "2",
        "--num-layers-per-virtual-pipeline-stage",
        "2",
        "--sequence-parallel",
        "--use-distributed-optimizer",
        "--overlap-grad-reduce",
        "--overlap-param-gather",
        "--micro-batch-size",
        "1",
        "--train-iters",
        "10",
        "--lr",
        "1e-4",
        "--lr-warmup-iters",
        "2",
        "--lr-decay-iters",
        "8",
        "--recompute-granularity",
        "full",
        "--recompute-method",
        "uniform",
        "--recompute-num-layers",
        "1",
        "--no-gradient-accumulation-fusion",
        "--no-bias-swiglu-fusion",
        "--no-bias-dropout-fusion",
        "--no-rope-fusion",
        "--no-masked-softmax-fusion",
        "--bf16",
        "--tp-comm-overlap",
        "--dist-ckpt-optim-fully-reshardable",
    ],
    "families_vpp_cp": [
        "--num-layers",
        "8",
        "--hidden-size",
        "256",
        "--num-attention-heads",
        "8",
        "--seq-length",
        "512",
        "--max-position-embeddings",
        "512",
        "--untie-embeddings-and-output-weights",
        "--disable-bias-linear",
        "--position-embedding-type",
        "rope",
        "--vocab-size",
        "1000",
        "--tokenizer-type",
        "NullTokenizer",
        "--pipeline-model-parallel-size",
        "2",
        "--num-virtual-stages-per-pipeline-rank",
        "2",
        "--context-parallel-size",
        "2",
        "--recompute-activations",
        "--train-iters",
        "10",
        "--lr",
        "1e-4",
        "--micro-batch-size",
        "1",
        "--apply-layernorm-1p",
        "--fp8-format",
        "hybrid",
        "--fp8-recipe",
        "tensorwise",
        "--fp8-amax-history-len",
        "16",
        "--fp8-amax-compute-algo",
        "max",
        "--bf16",
    ],
    "families_data_logging_checkpoint": [
        "--num-layers",
        "2",
        "--hidden-size",
        "128",
        "--num-attention-heads",
        "4",
        "--seq-length",
        "256",
        "--max-position-embeddings",
        "256",
        "--untie-embeddings-and-output-weights",
        "--disable-bias-linear",
        "--position-embedding-type",
        "rope",
        "--tokenizer-type",
        "HuggingFaceTokenizer",
        "--tokenizer-model",
        "/models/tok",
        "--train-data-path",
        "0.7",
        "/data/a",
        "0.3",
        "/data/b",
        "--valid-data-path",
        "/data/v",
        "--test-data-path",
        "/data/t",
        "--data-cache-path",
        "/cache",
        "--no-mmap-bin-files",
        "--num-workers",
        "4",
        "--micro-batch-size",
        "4",
        "--global-batch-size",
        "64",
        "--train-iters",
        "1000",
        "--lr",
        "1e-4",
        "--save",
        "/ckpt",
        "--load",
        "/ckpt",
        "--save-interval",
        "100",
        "--save-retain-interval",
        "500",
        "--no-load-optim",
        "--no-load-rng",
        "--finetune",
        "--ckpt-format",
        "torch_dist",
        "--exit-interval",
        "900",
        "--exit-duration-in-mins",
        "230",
        "--exit-signal-handler",
        "--exit-signal",
        "SIGUSR1",
        "--log-interval",
        "10",
        "--eval-interval",
        "200",
        "--eval-iters",
        "5",
        "--tensorboard-dir",
        "/tb",
        "--tensorboard-log-interval",
        "5",
        "--wandb-project",
        "p",
        "--wandb-exp-name",
        "e",
        "--wandb-save-dir",
        "/w",
        "--log-throughput",
        "--log-timers-to-tensorboard",
        "--log-memory-to-tensorboard",
        "--log-validation-ppl-to-tensorboard",
        "--manual-gc",
        "--manual-gc-interval",
        "50",
        "--empty-unused-memory-level",
        "2",
        "--calculate-per-token-loss",
        "--cross-entropy-loss-fusion",
        "--cross-entropy-fusion-impl",
        "te",
        "--distributed-timeout-minutes",
        "30",
        "--no-create-attention-mask-in-dataloader",
        "--use-mcore-models",
        "--attention-backend",
        "flash",
        "--use-checkpoint-opt_param-scheduler",
        "--profile",
        "--profile-step-start",
        "3",
        "--profile-step-end",
        "5",
        "--use-pytorch-profiler",
        "--no-persist-layer-norm",
        "--use-cpu-initialization",
        "--seed",
        "42",
    ],
    "families_inert": [
        "--num-layers",
        "4",
        "--hidden-size",
        "128",
        "--num-attention-heads",
        "4",
        "--seq-length",
        "128",
        "--max-position-embeddings",
        "128",
        "--untie-embeddings-and-output-weights",
        "--disable-bias-linear",
        "--position-embedding-type",
        "rope",
        "--vocab-size",
        "1000",
        "--tokenizer-type",
        "NullTokenizer",
        "--micro-batch-size",
        "1",
        "--train-iters",
        "10",
        "--lr",
        "1e-4",
        "--timing-log-level",
        "2",
        "--timing-log-option",
        "all",
        "--distributed-backend",
        "gloo",
        "--deterministic-mode",
        "--attention-softmax-in-fp32",
        "--apply-query-key-layer-scaling",
        "--dist-ckpt-strictness",
        "log_all",
        "--rerun-mode",
        "disabled",
        "--no-ckpt-fully-parallel-save",
        "--ckpt-fully-parallel-load",
        "--ckpt-assume-constant-structure",
        "--disable-gloo-process-groups",
        "--ddp-average-in-collective",
        "--ddp-bucket-size",
        "40000000",
        "--ddp-num-buckets",
        "4",
        "--no-align-grad-reduce",
        "--log-params-norm",
        "--log-num-zeros-in-grad",
        "--tensorboard-queue-size",
        "100",
        "--logging-level",
        "20",
        "--no-position-embedding",
        "--trust-remote-code",
        "--te-rng-tracker",
        "--lr-wsd-decay-style",
        "linear",
        "--check-weight-hash-across-dp-replicas-interval",
        "10",
        "--num-distributed-optimizer-instances",
        "2",
        "--wandb-entity",
        "team",
        "--distributed-timeout-seconds-after-init",
        "300",
        "--use-dist-ckpt",
        "--optimizer",
        "adam",
        "--cp-comm-type",
        "p2p",
        "--dataloader-type",
        "single",
        "--ckpt-format",
        "torch_dist",
        "--sample-rate",
        "1.0",
        "--weight-decay-incr-style",
        "constant",
        "--weight-decay",
        "0.05",
    ],
    "families_data_path": [
        "--num-layers",
        "2",
        "--hidden-size",
        "128",
        "--num-attention-heads",
        "4",
        "--seq-length",
        "256",
        "--max-position-embeddings",
        "256",
        "--untie-embeddings-and-output-weights",
        "--disable-bias-linear",
        "--position-embedding-type",
        "rope",
        "--tokenizer-type",
        "SentencePieceTokenizer",
        "--tokenizer-model",
        "/models/tok.model",
        "--data-path",
        "/data/a",
        "--micro-batch-size",
        "2",
        "--train-iters",
        "10",
        "--lr",
        "1e-4",
        "--lr-warmup-fraction",
        "0.1",
        "--grad-reduce-in-bf16",
        "--bf16",
    ],
}


def _fill(value: str) -> str:
    """``${DATA_PATH}/x`` -> ``/data/x``: a placeholder path for every shell variable (``${REPEAT}``: 1)."""
    import re

    if value in ("${REPEAT}", "$REPEAT"):
        return "1"
    return re.sub(r"\$\{?([A-Za-z_]+)\}?", lambda m: "/" + m.group(1).lower().replace("_path", ""), value)


def _yaml_args(model_args: dict) -> list[str]:
    argv = []
    for flag, value in model_args.items():
        if value is False or value is None:
            continue
        argv.append(flag)
        if value is True:
            continue
        if isinstance(value, list):
            argv += [_fill(str(v)) for v in value]
        else:
            argv += [_fill(v) for v in str(value).strip("[]").split()]  # as the shell splits it
    return argv


def collect_cases(tree: Path) -> list[dict]:
    """(name, source, argv) of every list described in the module docstring."""
    import yaml

    from tests.training.test_megatron_cli import GPT3_175B, LLAMA3_8B_FP8

    cases = [
        {
            "name": "llama3_8b_h100_fp8",
            "source": "tests/training/test_megatron_cli.py LLAMA3_8B_FP8",
            "argv": LLAMA3_8B_FP8,
        },
        {"name": "gpt3_175b_distributed", "source": "tests/training/test_megatron_cli.py GPT3_175B", "argv": GPT3_175B},
    ]
    for sh in sorted((tree / "examples/post_training/modelopt/conf").glob("*/*.sh")):
        text = sh.read_text()
        if 'MODEL_ARGS="' not in text or "--num-experts" in text or "--mamba" in text or "hybrid" in text:
            continue
        block = text.split('MODEL_ARGS="', 1)[1].split('"', 1)[0]
        argv = [_fill(t) for t in shlex.split(block.replace("\\\n", " "))]
        cases.append({"name": "modelopt_" + sh.stem, "source": str(sh.relative_to(tree)), "argv": argv})
    for cfg in sorted((tree / "tests/functional_tests/test_cases/gpt").glob("*/model_config.yaml")):
        name = cfg.parent.name
        if any(word in name for word in NOT_DENSE):
            continue
        model_args = (yaml.safe_load(cfg.read_text()) or {}).get("MODEL_ARGS") or {}
        argv = _yaml_args(model_args)
        if "--num-experts" in argv or "--perform-rl-step" in argv:
            continue
        cases.append({"name": name, "source": str(cfg.relative_to(tree)), "argv": argv})
    cases += [
        {"name": name, "source": "tools/dev/megatron_reference.py FAMILIES", "argv": argv}
        for name, argv in FAMILIES.items()
    ]
    return cases


def _flag_values(argv: list[str]) -> list[list[str]]:
    """argv as [flag, value, ...] groups."""
    groups = []
    for token in argv:
        if token.startswith("--") or not groups:
            groups.append([token])
        else:
            groups[-1].append(token)
    return groups


def adapt(argv: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(argv as run here, the [flag, values...] dropped as refused here, flags added) — the docstring's rules."""
    from megatron_fixedcode.arguments.out_of_scope import out_of_scope
    from megatron_fixedcode.arguments.default_only_flags import refused_value

    kept, refused, added = [], [], []
    for group in _flag_values(argv):
        if out_of_scope(group[0]) or refused_value(group[0], group[1:]):
            refused.append(group)
        else:
            kept.append(group)
    flags = {g[0] for g in kept}
    if not flags & {"--tokenizer-type", "--vocab-size", "--vocab-file"}:  # e.g. the modelopt confs
        added += ["--tokenizer-type", "NullTokenizer", "--vocab-size", "50257"]
    if "--lr" not in flags:  # the modelopt confs leave the training flags to their caller
        added += ["--lr", "1e-4"]
    if not flags & {"--train-iters", "--train-samples"}:
        added += ["--train-iters", "100"]
    return [t for g in kept for t in g] + added, refused, added


_RUNNER = r"""
import contextlib, io, json, os, sys, types, importlib, enum
tree = sys.argv[1]
sys.path.insert(0, tree)
import torch
pkg = types.ModuleType("megatron.training"); pkg.__path__ = [os.path.join(tree, "megatron", "training")]
sys.modules["megatron.training"] = pkg
gv = importlib.import_module("megatron.training.global_vars")
for n in dir(gv):
    if n.startswith("get_"):
        setattr(pkg, n, getattr(gv, n))
A = importlib.import_module("megatron.training.arguments")
A.get_device_arch_version = lambda: 9
def plain(v):
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, enum.Enum):
        return v.name
    return str(v)
cases = json.load(sys.stdin)
sys.argv = ["pretrain_gpt.py"]
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    defaults = vars(A.parse_args())
import argparse
parser = argparse.ArgumentParser(allow_abbrev=False)
A.add_megatron_arguments(parser)
flags = sorted(o for o in parser._option_string_actions if o.startswith("--"))
out = [flags, {k: plain(defaults[k]) for k in cases[0]["dests"] if k in defaults}]
for case in cases:
    sys.argv = ["pretrain_gpt.py", *case["argv"]]
    os.environ["WORLD_SIZE"] = str(case["world_size"])
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            args = A.parse_args()
            A.validate_args(args, {})
        ns = vars(args)
        values = {k: plain(ns[k]) for k in case["dests"] if k in ns and (k not in out[1] or plain(ns[k]) != out[1][k])}
        values.update({k: "__absent__" for k in out[1] if k not in ns})
        out.append(values)
    except BaseException as e:
        out.append({"__error__": f"{type(e).__name__}: {e}"})
print(json.dumps(out))
"""


def megatron_values(tree: Path, cases: list[dict], python: str) -> list[dict]:
    env = {
        **os.environ,
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "NCCL_ALGO": "Ring",
        "RANK": "0",
        "PYTHONWARNINGS": "ignore",
        "OMP_NUM_THREADS": "1",
    }
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [python, "-c", _RUNNER, str(tree)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        env=env,
        cwd="/tmp",
        timeout=1800,
    )
    if proc.returncode:
        raise SystemExit(proc.stderr[-4000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--megatron", type=Path, required=True, help="an extracted Megatron-LM tree (megatron/, examples/, tests/)"
    )
    ap.add_argument("--tag", default=None, help="the tag it was extracted from (recorded)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter with megatron-core's dependencies")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument(
        "--added-since",
        type=Path,
        default=None,
        metavar="OLDER_TREE",
        help="print the option strings --megatron's parser has and OLDER_TREE's lacks, and exit",
    )
    a = ap.parse_args()
    if a.added_since is not None:
        older = set(megatron_values(a.added_since, [{"argv": [], "world_size": 1, "dests": []}], a.python)[0])
        print(
            " ".join(
                f
                for f in megatron_values(a.megatron, [{"argv": [], "world_size": 1, "dests": []}], a.python)[0]
                if f not in older
            )
        )
        return
    from megatron_fixedcode.arguments.core_flags import build_parser

    ours = {action.dest for action in build_parser()._actions} | set(DERIVED)
    cases = []
    for case in collect_cases(a.megatron):
        argv, refused, added = adapt(case["argv"])
        cases.append(
            {
                **case,
                "argv_megatron": case["argv"],
                "argv": argv,
                "refused": refused,
                "added": added,
                "world_size": WORLD_SIZE,
                "dests": sorted(ours),
            }
        )
    flags, defaults, *values = megatron_values(a.megatron, cases, a.python)
    for case, got in zip(cases, values):
        del case["dests"]
        case["megatron"] = got
    a.out.parent.mkdir(parents=True, exist_ok=True)
    head = {
        "megatron_lm": a.tag,
        "world_size": WORLD_SIZE,
        "generated_by": "tools/dev/megatron_reference.py",
        "megatron_defaults": defaults,
        "megatron_flags": flags,
    }
    lines = [json.dumps(case, sort_keys=True) for case in cases]  # one list a line: diffs stay readable
    a.out.write_text(json.dumps(head, sort_keys=True)[:-1] + ', "cases": [\n' + ",\n".join(lines) + "\n]}\n")
    errors = [c["name"] + ": " + c["megatron"]["__error__"] for c in cases if "__error__" in c["megatron"]]
    print(f"{len(cases)} lists, {len(errors)} refused by Megatron-LM's own parser -> {a.out}")
    print("\n".join(errors))


if __name__ == "__main__":
    main()
