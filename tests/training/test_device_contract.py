"""Where things live and how they start, as Megatron-LM's trainer does it on GPUs, checked on CPU:

* initialisation does not depend on the layout: pipeline stages do not start with identical
  layers, and every global layer (and the head) starts from the weights the one-rank model gives
  it, under PP 2, interleaved PP 2 and TP 2;
* the model (parameters and buffers) goes to the runtime device, and so does every batch;
* every tensor the trainer hands a collective lives on the trainer's device;
* the context-parallel batch split equals megatron-core's load-balanced split;
* launch refusals (no GPU under the Slurm launchers, CP until proven, TE missing on a GPU) are
  exact messages.
GPU-marked tests rerun the trainer checks on CUDA (scripts/gpu_check.sh).
"""

from __future__ import annotations

import inspect
import types

import pytest
import torch

from megatron_fixedcode.compat import ParallelLayout
from megatron_fixedcode.compat.collectives import count_collectives, tensor_devices
from megatron_fixedcode.models import ModelConfig, build_transformer_config
from megatron_fixedcode.training import batches as batch_lib
from megatron_fixedcode.training.forward_backward import gpt_forward_step
from megatron_fixedcode.training.model_chunks import build_model_chunks
from tests.helpers import REPO, torchrun

INIT_WORKER = REPO / "tests" / "distributed" / "init_worker.py"


# --- layout-independent initialisation -----------------------------------------------------------


@pytest.fixture(scope="module")
def initial_weights(tmp_path_factory):
    out = tmp_path_factory.mktemp("init")
    torchrun(INIT_WORKER, "--layout", "single", "--out", str(out), nproc=1)
    for layout in ("pp2", "vpp2", "tp2"):
        torchrun(INIT_WORKER, "--layout", layout, "--out", str(out), nproc=2)
    return {
        layout: [torch.load(out / f"{layout}_rank{r}.pt") for r in range(1 if layout == "single" else 2)]
        for layout in ("single", "pp2", "vpp2", "tp2")
    }


def _layer_weights(rank_state: dict, number: int) -> dict[str, torch.Tensor]:
    prefix = f"layer{number}."
    return {k[len(prefix) :]: v for k, v in rank_state["weights"].items() if k.startswith(prefix)}


@pytest.mark.slow
def test_pipeline_stages_do_not_start_with_identical_layers(initial_weights):
    stage0, stage1 = initial_weights["pp2"]
    assert (stage0["ranks"]["pp_rank"], stage1["ranks"]["pp_rank"]) == (0, 1)
    for local in (0, 1):  # local layer j of each stage: global layers j+1 and j+3
        first, second = _layer_weights(stage0, local + 1), _layer_weights(stage1, local + 3)
        matrices = [name for name, w in first.items() if w.dim() == 2]
        assert matrices and all(not torch.equal(first[n], second[n]) for n in matrices), local


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["pp2", "vpp2"])
def test_pipeline_layers_and_head_start_as_in_the_one_rank_model(initial_weights, layout):
    single = initial_weights["single"][0]["weights"]
    seen = set()
    for rank_state in initial_weights[layout]:
        for name, weight in rank_state["weights"].items():
            assert torch.equal(weight, single[name]), (layout, name)
            seen.add(name)
    assert seen == set(single), "some global layer was not built by any stage"


@pytest.mark.slow
def test_tensor_parallel_shards_are_slices_of_the_one_rank_weights(initial_weights):
    """CPU initialisation draws each full weight, then slices it: TP does not change init either."""
    single = initial_weights["single"][0]["weights"]
    ranks = initial_weights["tp2"]
    for name, full in single.items():
        shards = [r["weights"][name] for r in ranks]
        if name not in ranks[0]["partition"]:
            assert all(torch.equal(s, full) for s in shards), name
            continue
        dim, stride = ranks[0]["partition"][name]  # stride 2: SwiGLU's fc1 holds [gate_r; up_r] per rank
        pieces = [s.chunk(stride, dim=dim) for s in shards]
        assert torch.equal(torch.cat([p[i] for i in range(stride) for p in pieces], dim=dim), full), name


# --- the device contract ---------------------------------------------------------------------------


def _tiny(variant: str) -> ModelConfig:
    return ModelConfig(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        ffn_hidden_size=128,
        seq_length=16,
        vocab_size=1000,
        make_vocab_size_divisible_by=64,
        input_embedding=variant,
    )


@pytest.mark.parametrize("variant", ["learned", "binary", "gf2", "random"])
def test_model_parameters_and_buffers_go_to_the_requested_device(single_rank, variant):
    """``meta`` stands in for a GPU: nothing may be left behind on the CPU (the fixed code's tables
    are buffers, the float code's table too)."""
    cfg = _tiny(variant)
    (chunk,) = build_model_chunks(
        cfg,
        build_transformer_config(cfg, ParallelLayout()),
        ParallelLayout(),
        single_rank,
        wrap_ddp=False,
        device="meta",
    )
    tensors = dict(chunk.named_parameters()) | dict(chunk.named_buffers())
    assert tensors and {name: t.device.type for name, t in tensors.items() if t.device.type != "meta"} == {}
    if variant != "learned":
        assert any(name.startswith("embedding.") for name, _ in chunk.named_buffers())


def test_forward_step_moves_the_batch_to_the_device():
    seen = {}

    def model(tokens, position_ids, attention_mask, labels):
        seen.update(tokens=tokens.device, position_ids=position_ids.device, labels=labels.device)
        return torch.zeros(tokens.shape, device=tokens.device)

    batch = {
        "tokens": torch.zeros(2, 8, dtype=torch.long),
        "labels": torch.zeros(2, 8, dtype=torch.long),
        "loss_mask": torch.ones(2, 8),
    }
    _, loss_func = gpt_forward_step(iter([batch]), model, device=torch.device("meta"))
    assert set(seen.values()) == {torch.device("meta")}
    assert loss_func.args[0].device == torch.device("meta")  # the loss mask too


def test_pinned_batches_move_without_changing_values():
    batch = {"tokens": torch.arange(12).reshape(2, 6), "loss_mask": torch.ones(2, 6)}
    moved = batch_lib.to_device(batch, torch.device("cpu"))
    assert all(torch.equal(moved[k], batch[k]) for k in batch)
    if torch.cuda.is_available():
        pinned = batch_lib.pin(batch)
        assert all(t.is_pinned() for t in pinned.values())


def test_collective_counter_records_the_device_of_every_tensor(single_rank):
    import torch.distributed as dist

    with count_collectives() as counts:
        dist.all_reduce(torch.ones(3))
        dist.all_reduce(torch.ones(2, dtype=torch.float64))
    assert tensor_devices(counts) == {"cpu": 2}


def test_trainer_collectives_use_the_trainer_device(monkeypatch):
    """global_sum/any_rank build their tensors on the device they are given, never by default on
    the CPU (NCCL refuses CPU tensors). The collective is intercepted; ``meta`` stands in for a GPU."""
    from megatron_fixedcode.utils import rank_agreement

    devices = []
    monkeypatch.setattr(rank_agreement.dist, "all_reduce", lambda t, **kw: devices.append(t.device))
    meta = torch.device("meta")
    with pytest.raises((NotImplementedError, RuntimeError)):  # reading a meta tensor back: there is no data
        rank_agreement.global_sum([1.0, 2.0], meta)
    with pytest.raises((NotImplementedError, RuntimeError)):
        rank_agreement.any_rank(True, meta)
    assert devices == [meta, meta]


# --- context parallelism: the batch split ----------------------------------------------------------


def test_context_parallel_positions_by_hand():
    assert batch_lib.context_parallel_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert batch_lib.context_parallel_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    assert batch_lib.context_parallel_positions(8, 1, 0).tolist() == list(range(8))
    with pytest.raises(ValueError, match="not divisible by 2 x context-parallel size 4"):
        batch_lib.context_parallel_positions(12, 4, 0)


@pytest.mark.parametrize("cp_size", [2, 4])
def test_context_parallel_split_matches_megatron_core(single_rank, cp_size, monkeypatch):
    import torch.distributed as dist
    from megatron.core.utils import get_batch_on_this_cp_rank

    # A stand-in CP group: 0.16 asks the group for its size/rank, 0.19 asks torch.distributed.
    world_size, rank = dist.get_world_size, dist.get_rank
    fake = lambda group: isinstance(group, types.SimpleNamespace)  # noqa: E731
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: group.size() if fake(group) else world_size(group))
    monkeypatch.setattr(dist, "get_rank", lambda group=None: group.rank() if fake(group) else rank(group))

    g = torch.Generator().manual_seed(0)
    batch = {
        "tokens": torch.randint(0, 1000, (3, 32), generator=g),
        "labels": torch.randint(0, 1000, (3, 32), generator=g),
        "loss_mask": torch.rand(3, 32, generator=g),
        "position_ids": torch.arange(32).expand(3, 32),
    }
    covered = []
    for cp_rank in range(cp_size):
        group = types.SimpleNamespace(size=lambda: cp_size, rank=lambda r=cp_rank: r)
        kwargs = {"cp_group": group}
        if "is_hybrid_cp" in inspect.signature(get_batch_on_this_cp_rank).parameters:  # megatron-core >= 0.19
            kwargs["is_hybrid_cp"] = False
        theirs = get_batch_on_this_cp_rank({k: v.clone() for k, v in batch.items()}, **kwargs)
        ours = batch_lib.split_for_context_parallel(batch, cp_size, cp_rank)
        assert set(ours) == set(theirs)
        for key in batch:
            assert torch.equal(ours[key], theirs[key]), (cp_rank, key)
        covered += ours["position_ids"][0].tolist()
    assert sorted(covered) == list(range(32))  # every position on exactly one CP rank


# --- launch refusals ---------------------------------------------------------------------------------


def _run_pretraining(argv, caplog):
    from megatron_fixedcode.arguments.parse import parse_pretrain_args
    from megatron_fixedcode.training.loop import run_pretraining
    from tests.helpers.pretrain import TINY

    code = run_pretraining(
        parse_pretrain_args([*TINY, "--data-path", "/nonexistent/prefix", "--train-iters", "1", *argv])
    )
    return code, [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_no_gpu_under_the_slurm_launchers_is_refused(monkeypatch, caplog):
    from megatron_fixedcode.training.runtime_checks import NO_GPU_UNDER_LAUNCHER

    monkeypatch.setenv("MFC_REQUIRE_CUDA", "1")
    assert _run_pretraining([], caplog) == (2, [NO_GPU_UNDER_LAUNCHER])
    assert NO_GPU_UNDER_LAUNCHER == (
        "MFC_REQUIRE_CUDA=1 (set by the Slurm launchers) but torch sees no CUDA GPU on this node (check the "
        "allocation's --gpus and CUDA_VISIBLE_DEVICES, and that torch is a CUDA build); refusing to train on the CPU"
    )


def test_transformer_engine_missing_on_a_gpu_is_an_exact_message(monkeypatch):
    from megatron_fixedcode.arguments.parse import parse_pretrain_args
    from megatron_fixedcode.models.builder import TE_INSTALL_HINT
    from tests.helpers.pretrain import TINY
    from megatron_fixedcode.training import gpu_features

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_features.importlib.util, "find_spec", lambda name: None)
    a = parse_pretrain_args(
        [*TINY, "--data-path", "x", "--train-iters", "1", "--transformer-impl", "transformer_engine"]
    ).performance
    with pytest.raises(ValueError) as e:
        gpu_features.check_gpu_features(a)
    assert (
        str(e.value)
        == f"--transformer-impl transformer_engine needs Transformer Engine, which is not importable: {TE_INSTALL_HINT}"
    )


def test_auto_without_te_on_a_gpu_warns(monkeypatch, caplog):
    from megatron_fixedcode.models import builder

    builder._warn_once.cache_clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(builder, "transformer_engine_available", lambda: False)
    assert builder.use_transformer_engine(_tiny("binary")) is False
    assert any("transformer_impl=auto on a GPU without Transformer Engine" in r.getMessage() for r in caplog.records)


def test_gpu_fusions_follow_megatron_lm_defaults_and_flags(monkeypatch):
    from megatron_fixedcode.training import gpu_features
    from megatron_fixedcode.arguments.parse import parse_pretrain_args
    from tests.helpers.pretrain import TINY

    argv = [*TINY, "--data-path", "x", "--train-iters", "1"]

    def fusions(argv, te_layers, gated_linear_unit):
        cfg = parse_pretrain_args(argv)
        return gpu_features.fusion_settings(
            cfg.performance,
            te_layers=te_layers,
            gated_linear_unit=gated_linear_unit,
            squared_relu=cfg.args.squared_relu,
        )

    if not torch.cuda.is_available():  # the CPU overrides turn every fusion off
        assert fusions(argv, te_layers=False, gated_linear_unit=True) == {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_features, "_importable", lambda name: True)
    on = fusions(argv, te_layers=True, gated_linear_unit=True)
    assert on == dict.fromkeys(
        [
            "gradient_accumulation_fusion",
            "bias_activation_fusion",
            "bias_dropout_fusion",
            "apply_rope_fusion",
            "masked_softmax_fusion",
        ],
        True,
    )
    off = fusions(
        [*argv, "--no-gradient-accumulation-fusion", "--no-rope-fusion"], te_layers=True, gated_linear_unit=False
    )
    assert (off["gradient_accumulation_fusion"], off["apply_rope_fusion"], off["bias_activation_fusion"]) == (
        False,
        False,
        False,
    )
    # Megatron-LM's GPT-2 block (GELU with linear biases) fuses bias-GELU; squared ReLU has no fused kernel
    gpt2 = [
        "--num-layers",
        "2",
        "--hidden-size",
        "64",
        "--num-attention-heads",
        "4",
        "--seq-length",
        "32",
        "--lr",
        "1e-3",
        "--vocab-size",
        "1024",
        "--data-path",
        "x",
        "--train-iters",
        "1",
    ]
    fused = lambda *f: fusions([*gpt2, *f], te_layers=True, gated_linear_unit=False)["bias_activation_fusion"]  # noqa: E731
    assert (fused(), fused("--no-bias-gelu-fusion"), fused("--disable-bias-linear"), fused("--squared-relu")) == (
        True,
        False,
        False,
        False,
    )
    monkeypatch.setattr(gpu_features, "_importable", lambda name: False)
    missing = fusions(argv, te_layers=False, gated_linear_unit=True)
    assert (
        missing["gradient_accumulation_fusion"],
        missing["apply_rope_fusion"],
        missing["masked_softmax_fusion"],
        missing["bias_activation_fusion"],
    ) == (False, False, False, True)


# --- the real trainer, one step: CPU here, CUDA on a GPU machine (scripts/gpu_check.sh) -----------

DEVICE_WORKER = REPO / "tests" / "distributed" / "device_worker.py"


def _one_step_placement(tmp_path, variant: str, *flags: str) -> dict:
    import json
    import os
    import subprocess
    import sys

    from tests.helpers.pretrain import TINY, data_args, write_corpus

    out = tmp_path / "placement.json"
    cmd = [
        sys.executable,
        str(DEVICE_WORKER),
        str(out),
        "--",
        *TINY,
        *data_args(write_corpus(tmp_path), "gpt"),
        "--train-iters",
        "2",
        "--input-embedding",
        variant,
        *flags,
    ]
    proc = subprocess.run(
        cmd,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def _assert_all_on(placement: dict, device: str) -> None:
    assert placement["trainer_device"].startswith(device)
    assert placement["tensor_devices"] == [placement["trainer_device"]] and placement["num_tensors"] > 0
    assert placement["input_devices"] == [placement["trainer_device"]]  # tokens, position ids, labels
    assert placement["collective_devices"] and set(placement["collective_devices"]) == {device}
    assert 6.0 < placement["loss"] < 8.0  # ln(1024) = 6.93 at init: the step really ran


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU runtime's placement")
def test_one_training_step_keeps_everything_on_the_cpu_runtime(tmp_path):
    _assert_all_on(_one_step_placement(tmp_path, "binary"), "cpu")


@pytest.mark.gpu
def test_one_training_step_keeps_everything_on_the_gpu(tmp_path):
    """BF16, local layers, a world of one on NCCL: every parameter, buffer, model input and
    collective tensor on this GPU after a real step (gpu_check's bench also records the placement
    of learned, binary and gf2 at the paper-2 block size)."""
    _assert_all_on(_one_step_placement(tmp_path, "gf2", "--bf16", "--transformer-impl", "local"), "cuda")
