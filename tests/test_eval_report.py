"""Seed aggregation and report tables against hand-computed numbers."""
import pytest

from megatron_fixedcode.eval import compare, comparison_markdown, model_markdown, seed_summary


def _run(label, seed, acc, acc_norm, **extra):
    return {"label": label, "seed": seed, **extra,
            "results": {"piqa_local@0shot": {"acc": acc, "acc_stderr": 0.01, "acc_norm": acc_norm, "sample_len": 10}}}


def test_seed_summary_by_hand():
    s = seed_summary([2.40, 2.36, 2.50])
    assert s["mean"] == pytest.approx(2.42) and s["n"] == 3
    assert s["relative_range"] == pytest.approx(0.14 / 2.42)  # (max - min) / mean = 5.785%


def test_comparison_keeps_acc_and_acc_norm_apart_and_lists_references():
    runs = [_run("binary", 1, 0.70, 0.72), _run("binary", 2, 0.68, 0.74), _run("learned", 1, 0.60, 0.61),
            _run("SmolLM2-135M", None, 0.65, 0.66, reference=True),
            {"label": "binary", "seed": 1, "loss": 2.0, "ppl": 7.389}]
    table = compare(runs)
    b = table["models"]["binary"]
    assert b["piqa_local@0shot/acc"]["mean"] == pytest.approx(0.69)
    assert b["piqa_local@0shot/acc"]["relative_range"] == pytest.approx(0.02 / 0.69)
    assert b["piqa_local@0shot/acc_norm"]["mean"] == pytest.approx(0.73)
    assert b["validation/loss"]["n"] == 1 and "piqa_local@0shot/sample_len" not in b
    assert table["references"] == {"SmolLM2-135M": {"piqa_local@0shot/acc": 0.65, "piqa_local@0shot/acc_norm": 0.66}}
    md = comparison_markdown(table)
    assert "| metric | binary | learned | SmolLM2-135M (ref) |" in md
    assert "| piqa_local@0shot/acc | 0.6900 (range 2.9%, n=2) | 0.6000 (range 0.0%, n=1) | 0.6500 |" in md
    single = model_markdown(runs[0])
    assert "| piqa_local@0shot | acc | 0.7000 | 0.0100 |" in single and "acc_norm | 0.7200" in single
