"""The analysis tools give known answers on constructed cases."""

import numpy as np
import pytest
import torch

from megatron_fixedcode.analysis import (
    activation_patching,
    activation_stats,
    hidden_states,
    layer_ablation,
    next_token_nll,
    probe_accuracy,
    skip_block,
)
from megatron_fixedcode.compat import ParallelLayout
from megatron_fixedcode.models import ModelConfig, build_gpt_model, build_transformer_config

VOCAB = 512


def config(input_embedding="binary"):
    return ModelConfig(
        num_layers=3,
        hidden_size=32,
        num_attention_heads=4,
        ffn_hidden_size=64,
        seq_length=24,
        vocab_size=VOCAB,
        input_embedding=input_embedding,
        code_offset=1 if input_embedding != "learned" else 0,
    )


def model(pg, input_embedding="binary", identity_block=None):
    cfg = config(input_embedding)
    torch.manual_seed(3)
    m = build_gpt_model(cfg, build_transformer_config(cfg, ParallelLayout()), pg).eval()
    if identity_block is not None:  # zero output projections: the block adds nothing to the residual
        layer = m.decoder.layers[identity_block]
        with torch.no_grad():
            layer.self_attention.linear_proj.weight.zero_()
            layer.mlp.linear_fc2.weight.zero_()
    return m


def ids(num=4, seq=24, seed=0):
    return torch.randint(1, VOCAB, (num, seq), generator=torch.Generator().manual_seed(seed))


@pytest.mark.slow
def test_ablating_an_identity_block_changes_nothing(single_rank):
    m = model(single_rank, identity_block=1)
    report = layer_ablation(m, ids(), VOCAB)
    deltas = [row["delta"] for row in report["blocks"]]
    assert deltas[1] == 0.0  # bit for bit
    assert abs(deltas[0]) > 1e-6 and abs(deltas[2]) > 1e-6  # the others do something
    with skip_block(m, 0):
        pass
    assert next_token_nll(m, ids(), VOCAB) == report["loss"]  # the hook is gone afterwards


@pytest.mark.slow
def test_patching_a_context_with_itself_changes_nothing(single_rank):
    m = model(single_rank)
    x = ids(1)[0]
    report = activation_patching(m, x, x.clone(), VOCAB)
    assert report["restored"] is None and report["changed_positions"] == []
    assert all(d == 0.0 for row in report["delta"] for d in row)
    assert len(report["delta"]) == 4 and len(report["delta"][0]) == 24  # sites x positions


@pytest.mark.slow
def test_patching_the_changed_position_at_the_input_restores_everything(single_rank):
    m = model(single_rank)
    clean = ids(1)[0]
    corrupt = clean.clone()
    corrupt[5] = (clean[5] + 7) % VOCAB
    report = activation_patching(m, clean, corrupt, VOCAB)
    assert report["changed_positions"] == [5]
    assert report["restored"][0][5] == pytest.approx(1.0, abs=1e-9)  # site 0 = the input itself
    assert report["delta"][0][4] == 0.0  # an unchanged position carries the same input


def test_probe_of_random_labels_stays_at_chance(single_rank):
    m = model(single_rank)
    x = ids(32)
    states = hidden_states(m, x)
    labels = np.random.default_rng(1).integers(0, 2, x.numel())
    for states_BSH in states:
        r = probe_accuracy(states_BSH.reshape(x.numel(), -1).numpy(), labels)
        assert abs(r["accuracy"] - 0.5) < 0.1, r  # 231 held-out examples: chance ± 3 s.e.


def test_probe_decodes_token_identity_from_an_injective_code(single_rank):
    m = model(single_rank)
    x = torch.randint(1, 9, (8, 24), generator=torch.Generator().manual_seed(2))  # 8 token types
    site0 = hidden_states(m, x)[0].reshape(x.numel(), -1).numpy()
    assert probe_accuracy(site0, x.flatten().numpy(), l2=1e-3)["accuracy"] == 1.0


def test_activation_stats_token_variance_is_one_at_the_input(single_rank):
    for kind in ("binary", "learned"):
        m = model(single_rank, kind)
        x = torch.randint(1, 20, (4, 24), generator=torch.Generator().manual_seed(4))
        report = activation_stats(hidden_states(m, x), x)
        assert report["sites"][0]["token_variance_fraction"] == pytest.approx(1.0)
        assert report["sites"][-1]["token_variance_fraction"] < 1.0


@pytest.mark.slow
def test_run_analysis_on_a_saved_checkpoint_writes_json_and_plots(single_rank, tmp_path):
    import dataclasses
    import json

    from megatron_fixedcode.analysis.run import AnalysisConfig, run_analysis
    from megatron_fixedcode.checkpoint.single_process import save_megatron_checkpoint
    from tests.helpers.data import write_indexed_dataset

    m = model(single_rank, "gf2")
    docs = [np.random.default_rng(i).integers(1, VOCAB, 200) for i in range(3)]
    prefix = write_indexed_dataset(tmp_path / "valid", docs, dtype=np.uint16)
    state = {
        "model_config": dataclasses.asdict(config("gf2")),
        "tokenizer": None,
        "step": 0,
        "tokens": 0,
        "run_config": {"valid_data_path": [prefix]},
    }
    save_megatron_checkpoint(tmp_path / "ckpt", m, state)
    report = run_analysis(
        AnalysisConfig(
            load=str(tmp_path / "ckpt"),
            output_dir=str(tmp_path / "out"),
            num_windows=8,
            probe_classes=8,
            patch_length=12,
            patch_position=4,
        )
    )
    saved = json.loads((tmp_path / "out" / "analysis.json").read_text())
    assert saved["input_embedding"] == "gf2" and len(saved["sites"]) == 4
    windows = torch.from_numpy(np.concatenate(docs)[: 8 * 24].astype(np.int64)).reshape(8, 24)
    assert saved["ablation"]["loss"] == pytest.approx(next_token_nll(m, windows, VOCAB), rel=1e-12)
    assert {p.split("/")[-1] for p in report["plots"]} == {
        "activations.png",
        "ablation.png",
        "probes.png",
        "patching.png",
    }
    assert saved["probes"]["token_identity"][0]["accuracy"] == 1.0  # an injective code, read linearly
