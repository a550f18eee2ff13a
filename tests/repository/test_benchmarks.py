"""The benchmarks run (``--smoke``) and report what they promise. No timing assertions."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from megatron_fixedcode.codes import CodeSpec
from megatron_fixedcode.compat import ParallelLayout
from megatron_fixedcode.models import FixedCodeEmbedding, ModelConfig, build_transformer_config
from tests.helpers import REPO


def run_benchmark(script: str, *args: str, timeout: int = 300) -> dict:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), "--smoke", "--json", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_embedding_benchmark():
    r = run_benchmark("embedding.py")
    v = r["variants"]
    assert set(v) == {"learned", "fixed_binary", "fixed_gf2", "fixed_gf2_lookup", "torch_ops_gf2"}
    from megatron_fixedcode.kernels import fixed_code_cpu_kernel

    assert r["fused_cpu_kernel"] is (fixed_code_cpu_kernel() is not None)  # auto uses it wherever it builds
    assert 0 < r["torch_ops_fwd_fraction_of_bandwidth"]
    assert 0 < r["fixed_fwd_fraction_of_bandwidth"] and 0 < r["fixed_over_learned_step_time"]
    table = r["padded_vocab_size"] * r["hidden_size"] * 4
    assert v["learned"]["param_bytes"] == v["learned"]["grad_bytes"] == table
    assert v["learned"]["optimizer_state_bytes"] == 2 * table  # Adam exp_avg + exp_avg_sq
    assert v["learned"]["peak_bytes"] >= 4 * table + r["output_bytes"]
    for name in ("fixed_binary", "fixed_gf2", "fixed_gf2_lookup", "torch_ops_gf2"):
        assert v[name]["param_bytes"] == v[name]["grad_bytes"] == v[name]["optimizer_state_bytes"] == 0
        assert v[name]["peak_bytes"] < v["learned"]["peak_bytes"]
    assert r["fixed_state_bytes"] == 0 and r["learned_state_bytes"] == 4 * table
    assert r["machine"]["load_average"] and r["output_dtype"] == "torch.float32"


@pytest.mark.slow
def test_train_step_benchmark():
    r = run_benchmark("train_step.py")
    (tiny,) = r["recipes"]
    for inp in ("learned", "binary", "gf2"):
        mega, ref = tiny[f"megatron_{inp}"], tiny[f"torch_{inp}"]
        assert mega["tokens_per_s"] > 0 and ref["tokens_per_s"] > 0 and tiny[f"megatron_over_torch_{inp}"] > 0
        # The reference is the same model: same weights, same batch, same first loss.
        assert tiny[f"first_loss_rel_diff_{inp}"] < 1e-5, (mega["first_loss"], ref["first_loss"])
    table = 4096 * 64 * 4
    assert tiny["table_state_bytes"] == 4 * table
    # weight, grad buffer, exp_avg, exp_avg_sq of the table, less the fixed code's small buffers
    # (K row masks and offset bits, 2 x 256 id-byte tables: 1,280 bytes at K = 12)
    resident = tiny["megatron_learned"]["resident_bytes"] - tiny["megatron_binary"]["resident_bytes"]
    assert 4 * table - 4096 <= resident <= 4 * table, resident
    assert tiny["megatron_binary_peak_saving_bytes"] >= 4 * table


@pytest.mark.slow
def test_comm_benchmark():
    r = run_benchmark("comm.py", timeout=600)
    tp = r["tp2_sp"]
    assert r["fixed_input_layer_calls"] == 0 and r["fixed_input_layer_bytes"] == 0
    assert tp["learned"]["forward"]["calls"] == 1 and tp["learned"]["backward"]["calls"] == 1
    full = r["seq"] * r["micro_batch_size"] * r["hidden_size"] * 4
    assert tp["learned"]["full_activation_bytes"] == 2 * full
    assert tp["learned"]["bytes"] == full // 2 + full  # counted: output shard fwd, gathered output bwd
    assert tp["learned"]["trainable_params"] == r["dp2"]["learned"]["padded_vocab_size"] * r["hidden_size"] // 2
    dp = r["dp2"]
    assert dp["bytes_saved"] == dp["table_grad_bytes"] == dp["learned"]["padded_vocab_size"] * r["hidden_size"] * 4
    assert dp["learned"]["grad_buffer_bytes"] - dp["binary"]["grad_buffer_bytes"] == dp["table_grad_bytes"]


@pytest.mark.slow
def test_dataloader_benchmark():
    result = run_benchmark("dataloader.py")
    assert result["consumption_samples_per_s"] == 8.0  # 128 samples / 8 s / 2 ranks
    assert result["samples_per_s"] > 0 and result["headroom"] == pytest.approx(
        result["samples_per_s"] / result["consumption_samples_per_s"]
    )
    assert result["gpt_samples_per_s"] > 0 and result["gpt_headroom"] == pytest.approx(
        result["gpt_samples_per_s"] / result["consumption_samples_per_s"]
    )


def _old_lift(module: FixedCodeEmbedding, bits_SBK: torch.Tensor) -> torch.Tensor:
    """The lift as first written (tile with repeat, truncate, then scale): the optimized one must match."""
    num_bits, hidden = module.code_spec.num_bits, module.config.hidden_size
    x = bits_SBK.to(torch.int64).to(module.output_dtype).repeat(1, 1, -(-hidden // num_bits))[..., :hidden]
    return x * module.code_spec.scale if module.code_spec.scale != 1.0 else x


@pytest.mark.parametrize("impl", ["table_free", "lookup"])
@pytest.mark.parametrize("hidden,scale,bf16", [(64, 1.0, False), (40, 0.37, False), (72, 0.37, True), (16, 3.0, True)])
def test_fixed_code_lift_is_bit_identical_to_repeat(single_rank, impl, hidden, scale, bf16):
    cfg = ModelConfig(
        num_layers=1,
        hidden_size=hidden,
        num_attention_heads=4,
        ffn_hidden_size=16,
        seq_length=8,
        vocab_size=1000,
        bf16=bf16,
    )
    config = build_transformer_config(cfg, ParallelLayout())
    spec = CodeSpec.create(kind="gf2", vocab_size=1000, hidden_size=hidden, scale=scale, implementation=impl, offset=5)
    module = FixedCodeEmbedding(config, spec, tp_group=single_rank.tp)
    ids_BS = torch.arange(1000).reshape(4, 250)
    x_SBH = module(ids_BS)
    assert x_SBH.is_contiguous() and x_SBH.dtype == (torch.bfloat16 if bf16 else torch.float32)
    assert torch.equal(x_SBH, _old_lift(module, module.code_bits(ids_BS.t())))
    expected = spec.vectors(np.arange(1000)).reshape(4, 250, hidden).transpose(1, 0, 2)
    assert np.array_equal(x_SBH.double().numpy(), torch.tensor(expected).to(x_SBH.dtype).double().numpy())


def test_ratio_plot_scores_targets_both_ways(tmp_path):
    """plot_ratios: 'at least' and 'at most' targets both score >= 1 exactly when met; a PNG is drawn."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from plot_ratios import collect_ratios, main

    emb = {"benchmark": "embedding", "fixed_fwd_fraction_of_bandwidth": 0.9, "fixed_over_learned_step_time": 0.02}
    rec = {
        "recipe": "tiny",
        "megatron_binary_peak_saving_bytes": 48,
        "table_state_bytes": 48,
        **{f"megatron_over_torch_{i}": 0.85 for i in ("learned", "binary", "gf2")},
        "megatron_binary_over_learned_tokens_per_s": 1.04,
        "megatron_gf2_over_learned_tokens_per_s": 1.06,
    }
    data = {"benchmark": "dataloader", "headroom": 500.0, "gpt_headroom": 9.0}
    rows = {r.label: r for r in collect_ratios([emb, {"benchmark": "train_step", "recipes": [rec]}, data])}
    assert not rows["input layer: fixed forward / bandwidth bound"].met
    step = rows["input layer: fixed / learned step time"]
    assert step.met and step.score == pytest.approx(2.5)
    assert not rows["tiny: binary / learned tokens/s"].met and rows["tiny: gf2 / learned tokens/s"].met
    assert rows["tiny: peak saving / table state"].met and rows["data: document windows samples/s / consumption"].met
    assert not rows["data: megatron GPTDataset samples/s / consumption"].met
    files = []
    for i, obj in enumerate((emb, data)):
        files.append(tmp_path / f"{i}.json")
        files[-1].write_text("log line\n" + json.dumps(obj) + "\n")
    out = tmp_path / "ratios.png"
    main([*map(str, files), "--out", str(out)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit, match="no JSON object"):
        (tmp_path / "empty.json").write_text("nothing\n")
        main([str(tmp_path / "empty.json")])


@pytest.mark.slow
def test_checkpoint_io_benchmark():
    r = run_benchmark("checkpoint_io.py")
    one, two = r["phases"]
    assert (one["ranks"], two["ranks"]) == (1, 2)
    assert set(one["bytes_written_by_rank"]) == {"0"} and set(two["bytes_written_by_rank"]) == {"0", "1"}
    # the fully parallel save splits the replicated state: the two shares add up to the 1-rank write
    assert sum(two["bytes_written_by_rank"].values()) == pytest.approx(one["bytes_written_by_rank"]["0"], rel=0.05)
    assert 1.0 <= r["write_balance_2_ranks"] <= 1.5
    assert all(p["save_s"] > 0 and p["verify_s"] > 0 and p["load_s"] > 0 for p in r["phases"])


@pytest.mark.slow
def test_checkpoint_format_benchmark():
    """--formats: one save per distributed-optimizer format on 2 ranks, host memory per rank."""
    r = run_benchmark("checkpoint_io.py", "--formats")
    assert [p["format"] for p in r["phases"]] == ["fully_reshardable", "dp_reshardable"]
    for p in r["phases"]:
        assert p["ranks"] == 2 and len(p["save_added_rss_by_rank"]) == 2 and p["save_s"] > 0
        assert p["optimizer_state_bytes"] == 12 * p["params"] == 2 * p["rank_share_bytes"]


@pytest.mark.slow
def test_async_save_benchmark():
    """The same run with and without --async-save: every step logged, the saves' blocking times, the ratio."""
    r = run_benchmark("async_save.py")
    sync, asynchronous = r["runs"]
    assert (sync["async"], asynchronous["async"]) == (False, True)
    for run in r["runs"]:
        assert run["steps"] == r["model"]["iters"] and run["during_saves_steps"] == [4, 7]
        assert len(run["save_blocking_s"]) == 3 and run["step_s_mean_during_saves"] > 0
    assert r["async_over_sync_during_saves"] > 0


@pytest.mark.slow
def test_goodput_benchmark():
    """Eighteen rows (16, 256 and 4,096 GPUs x six strategies) from this machine's measured rates; at 4,096 GPUs
    an in-job restart keeps far more of the run than waiting for a person (hours per failure), and cutting a lost
    node out far more than requeueing for a 2 h queue, at little cost against a restart that finds a spare node."""
    out = run_benchmark("goodput.py")
    rows = {(r["gpus"], r["strategy"]): r for r in out["rows"]}
    assert len(rows) == 18 and out["restart_fixed_s"] > 0 and 0 < out["rates"]["async_blocking_share"] < 1
    assert out["assumed"]["queue_wait_hours"] == 2 and out["assumed"]["repair_hours"] == 24
    assert rows[(4096, "in-job restart")]["goodput"] > rows[(4096, "requeue by a person")]["goodput"] + 0.1
    wait, shrink = rows[(4096, "requeue and wait")]["goodput"], rows[(4096, "shrink and continue")]["goodput"]
    assert shrink > wait + 0.05 and shrink > rows[(4096, "in-job restart")]["goodput"] - 0.02
    for gpus in (16, 256, 4096):
        assert rows[(gpus, "+ non-persistent (async)")]["save_s"] < rows[(gpus, "+ non-persistent (sync)")]["save_s"]
        for strategy in ("requeue and wait", "shrink and continue"):
            assert 0 < rows[(gpus, strategy)]["goodput"] <= 1 and rows[(gpus, strategy)]["vs_requeue"] > 0
