"""The LM Evaluation Harness end to end on a tiny export, with local-file tasks built from the
benchmark samples in tests/assets (skipped when lm-eval is absent)."""

import json

import pytest

from tests.helpers.export import random_checkpoint
from tests.helpers import SMOLLM2_TOKENIZER

pytest.importorskip("lm_eval")
pytest.importorskip("accelerate")


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    from megatron_fixedcode.export import convert_checkpoint_to_hf

    root = tmp_path_factory.mktemp("harness")
    src = random_checkpoint(
        root / "ckpt",
        input_embedding="binary",
        vocab_size=49152,
        hidden_size=32,
        num_attention_heads=2,
        ffn_hidden_size=64,
        num_layers=1,
        seq_length=256,
        tokenizer_model=str(SMOLLM2_TOKENIZER),
    )
    return convert_checkpoint_to_hf(src, root / "hf")


@pytest.mark.slow
def test_local_tasks_score_an_export(tmp_path, export, monkeypatch):
    from megatron_fixedcode.eval.harness import run_harness

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_datasets"))
    out = run_harness(export, "piqa_local,arc_easy_local,winogrande_local,lambada_local", limit=4, batch_size=4)
    rows = out["results"]
    assert set(rows) == {"piqa_local@0shot", "arc_easy_local@0shot", "winogrande_local@0shot", "lambada_local@0shot"}
    for task in ("piqa_local@0shot", "arc_easy_local@0shot"):
        assert {"acc", "acc_norm", "acc_stderr", "acc_norm_stderr"} <= set(rows[task])
        assert 0 <= rows[task]["acc"] <= 1 and rows[task]["sample_len"] == 4
    assert "acc_norm" not in rows["winogrande_local@0shot"]
    assert rows["lambada_local@0shot"]["perplexity"] > 1
    assert out["input_embedding"] == "binary" and out["config"]["prefix_token_id"] == 0
    json.dumps(out)


def test_local_data_reads_original_formats():
    import importlib.util

    from megatron_fixedcode.eval.harness import LOCAL_TASKS_DIR

    spec = importlib.util.spec_from_file_location("local_data", LOCAL_TASKS_DIR / "local_data.py")
    local = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(local)
    piqa = local.piqa()["validation"]
    assert len(piqa) == 40 and set(piqa[0]) == {"goal", "sol1", "sol2", "label"}  # the samples' sizes
    assert [r["label"] for r in piqa][:6] == [0, 1, 1, 1, 0, 1]  # labels aligned with the questions
    assert len(local.arc_challenge()["test"]) == 40 and len(local.winogrande()["validation"]) == 40
    assert len(local.lambada()["test"]) == 40
    pages = local.wikitext2_valid()["validation"]
    assert len(pages) == 11 and pages[0]["page"].startswith(" = ")


@pytest.mark.slow
def test_two_checkpoints_see_identical_request_sets_and_report_truncation(tmp_path, monkeypatch):
    """Paper 2's audit: equal request hashes per task for two variants, and requests cut to a
    64-token context counted (LAMBADA passages are longer than 64 tokens)."""
    from megatron_fixedcode.eval import compare, comparison_markdown
    from megatron_fixedcode.eval.harness import run_harness
    from megatron_fixedcode.export import convert_checkpoint_to_hf

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_datasets"))
    outs = []
    for variant in ("binary", "gf2"):
        src = random_checkpoint(
            tmp_path / variant,
            input_embedding=variant,
            vocab_size=49152,
            hidden_size=32,
            num_attention_heads=2,
            ffn_hidden_size=64,
            num_layers=1,
            seq_length=64,
            tokenizer_model=str(SMOLLM2_TOKENIZER),
        )
        out = run_harness(
            convert_checkpoint_to_hf(src, tmp_path / f"{variant}_hf"), "piqa_local,lambada_local", limit=4, batch_size=4
        )
        outs.append({**out, "label": variant})
    a, b = (o["requests"] for o in outs)
    assert set(a) == set(b) == {"piqa_local@0shot", "lambada_local@0shot"}
    assert a["piqa_local@0shot"]["requests"] == 8 and a["lambada_local@0shot"]["requests"] == 4  # 2 choices x 4
    for task in a:
        assert a[task] == b[task] and a[task]["max_length"] == 64
    assert a["piqa_local@0shot"]["truncated"] == 0 and 0 < a["lambada_local@0shot"]["truncated"] <= 4
    table = compare(outs)
    assert table["differing_request_sets"] == {} and "Request sets differ" not in comparison_markdown(table)
