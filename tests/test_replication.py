"""The small replication: its summary arithmetic, and the whole pipeline end to end in --quick mode
(shared corpus, SmolLM2 tokenizer, 3 inputs × 2 seeds, evaluation, markdown and plot)."""
import json
import os
from pathlib import Path

import pytest

from megatron_fixedcode.replication.report import comparison_lines, seed_summary, summarize
from tests.helpers import REPO

SHARED = Path(os.environ.get("MFC_SHARED_DATA", REPO.parent / "shared" / "data"))


def test_seed_summary_is_paper_ones_relative_range():
    s = seed_summary([2.0, 2.5, 2.3])
    assert s["mean"] == pytest.approx(6.8 / 3)
    assert s["relative_range"] == pytest.approx(0.5 / (6.8 / 3))


def test_comparison_lines_say_whether_seed_ranges_overlap():
    run = lambda ppl: {"val_ppl": ppl, "lambada": {"accuracy": 0.0, "stderr": 0.0}, "tokens_trained": 1}  # noqa: E731
    table = summarize({"learned": {1: run(10.0), 2: run(11.0)}, "binary": {1: run(12.0), 2: run(13.0)},
                       "gf2": {1: run(10.5), 2: run(12.5)}})
    lines = comparison_lines(table)
    assert "do not overlap" in lines[0] and "+19.0%" in lines[0]
    assert "overlap" in lines[1] and "do not" not in lines[1]


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED / "tokenizers" / "smollm2" / "tokenizer.json").exists(), reason="no shared data")
def test_quick_replication_end_to_end(tmp_path):
    from megatron_fixedcode.replication.__main__ import main

    assert main(["--quick", "--work-dir", str(tmp_path)]) == 0
    md = (tmp_path / "REPLICATION.md").read_text()
    for variant in ("learned", "binary", "gf2"):
        assert f"| {variant} |" in md
    assert (tmp_path / "loss.png").stat().st_size > 10_000
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["table"]) == {"learned", "binary", "gf2"}
    for variant, table in results["table"].items():
        assert table["seeds"] == [1, 2] and all(p > 1 for p in table["val_ppl"])
    # different seeds train different models; the same held-out tokens evaluate all of them
    assert results["table"]["binary"]["val_ppl"][0] != results["table"]["binary"]["val_ppl"][1]
    assert len({r["val_tokens"] for v in results["results"].values() for r in v.values()}) == 1
