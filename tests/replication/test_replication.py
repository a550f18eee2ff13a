"""The small-scale study's runner: run identity (config hash), skip-what-is-done, the report's
arithmetic, and the whole --quick path end to end, including a deleted record retrained to the same
perplexity and --verify."""

import json
import shutil
import subprocess
import sys

import pytest

from megatron_fixedcode.replication.page import gap_percent, ppl_table, read_curve, variant_table
from megatron_fixedcode.replication.store import ResultStore
from megatron_fixedcode.replication.study import PLANS, VARIANTS, Run, StudyPlan
from tests.helpers import REPO


def test_run_names_parse_both_ways():
    assert Run.parse("binary:1") == Run("binary", 1)
    assert Run.parse("binary_normmatch_s3") == Run("binary_normmatch", 3)
    assert Run.parse("gf2_r2:1").name == "gf2_r2_s1"
    with pytest.raises(ValueError, match="VARIANT:SEED"):
        Run.parse("embedding:1")


def test_full_plan_is_three_seeds_of_each_main_variant_and_the_controls():
    runs = PLANS["full"].runs
    assert len(runs) == len(set(runs)) == 16
    for variant in ("learned", "binary", "gf2"):
        assert sorted(r.seed for r in runs if r.variant == variant) == [1, 2, 3]
    assert {r.variant for r in runs} == set(VARIANTS)
    assert runs[:4] == (Run("learned", 1), Run("binary", 1), Run("gf2", 1), Run("binary_normmatch", 1))
    assert "--code-seed 12345" in " ".join(PLANS["full"].trainer_flags(Run("gf2", 2)))


def test_config_hash_covers_what_decides_the_numbers(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("hidden_size: 64\n")
    plan = StudyPlan(
        name="t",
        recipe=recipe,
        vocab_size=512,
        corpus_mb=1,
        train_iters=10,
        eval_tokens=100,
        runs=(Run("learned", 1), Run("binary", 1)),
    )
    h = plan.config_hash(Run("binary", 1), "data1")
    assert h == plan.config_hash(Run("binary", 1), "data1")
    different = {
        plan.config_hash(Run("binary", 2), "data1"),
        plan.config_hash(Run("learned", 1), "data1"),
        plan.config_hash(Run("binary", 1), "data2"),
        StudyPlan(**{**plan.__dict__, "train_iters": 11}).config_hash(Run("binary", 1), "data1"),
    }
    recipe.write_text("# a comment does not decide a number\nhidden_size:   64   # nor does layout\n")
    assert plan.config_hash(Run("binary", 1), "data1") == h
    recipe.write_text("hidden_size: 96\n")
    different.add(plan.config_hash(Run("binary", 1), "data1"))
    assert h not in different and len(different) == 5


def test_store_counts_a_record_only_for_its_config_hash(tmp_path):
    store = ResultStore(tmp_path / "results")
    run = Run("binary", 1)
    assert not store.is_done(run, "abc")
    store.write(run, {"config_hash": "abc", "val_ppl": 12.5})
    assert store.is_done(run, "abc") and not store.is_done(run, "abd")
    assert not list((tmp_path / "results").glob("*.tmp"))
    assert store.current((run, Run("learned", 1)), {run: "abc", Run("learned", 1): "x"}) == {
        run: {"config_hash": "abc", "val_ppl": 12.5}
    }
    assert store.current((run,), {run: "other"}) == {}


def test_table_gives_seed_ranges_and_the_gap_in_percent_not_in_learned_seed_ranges():
    records = {
        Run("learned", 1): {"val_ppl": 100.0},
        Run("learned", 2): {"val_ppl": 104.0},
        Run("learned", 3): {"val_ppl": 102.0},
        Run("binary", 1): {"val_ppl": 110.0},
        Run("binary", 2): {"val_ppl": 112.0},
        Run("random", 1): {"val_ppl": 101.0},
    }
    table = variant_table(records)
    assert list(table) == ["learned", "binary", "random"]
    assert gap_percent(table, "binary") == pytest.approx(100 * (111.0 - 102.0) / 102.0)
    assert gap_percent(table, "random") == pytest.approx(100 * (101.0 - 102.0) / 102.0)
    rows = ppl_table(table, [1, 2, 3])
    assert "seed range (min – max)" in rows[0] and "learned seed ranges" not in rows[0]
    assert rows[2].startswith("| learned | 100.0 | 104.0 | 102.0 | 102.0 | 100.0 – 104.0 | 3.92% | – |")
    assert rows[3].startswith("| binary | 110.0 | 112.0 | – | 111.0 | 110.0 – 112.0 | 1.80% | +8.8% |")
    assert rows[4].startswith("| random | 101.0 | – | – | 101.0 | n/a (1 seed) | n/a | -1.0% |")
    assert gap_percent(variant_table({Run("binary", 1): {"val_ppl": 2.0}}), "binary") is None  # no learned run


def test_read_curve_keeps_the_last_line_of_a_step_logged_twice_on_resume(tmp_path):
    path = tmp_path / "m.jsonl"
    lines = [
        {"step": 1, "loss": 5.0},
        {"step": 2, "loss": 4.0, "val_loss": 4.5},
        {"step": 3, "loss": 3.9},
        {"step": 3, "loss": 3.8},
        {"step": 4, "loss": 3.5, "val_loss": 3.6},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert read_curve(path) == ([1, 2, 3, 4], [5.0, 4.0, 3.8, 3.5], [2, 4], [4.5, 3.6])


def _study(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "megatron_fixedcode.replication", "--quick", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=900,
    )


@pytest.mark.slow
def test_quick_study_end_to_end_skips_what_is_done_and_reproduces_a_run(tmp_path):
    work = str(tmp_path)
    first = _study("--work-dir", work)
    assert first.returncode == 0, first.stderr[-3000:]
    plan = PLANS["quick"]
    results = tmp_path / "results"
    records = {r: json.loads((results / f"{r.name}.json").read_text()) for r in plan.runs}
    assert f"trained {len(plan.runs)} now, skipped 0" in first.stdout
    md = (tmp_path / "REPLICATION.md").read_text()
    for run, rec in records.items():
        assert rec["config_hash"] == plan.config_hash(run, rec["data_fingerprint"])
        assert rec["tokens_trained"] == plan.train_iters * 4 * 64
        assert f"{rec['val_ppl']:.1f}" in md
    assert len({rec["val_tokens"] for rec in records.values()}) == 1  # the same held-out windows for all
    assert records[Run("binary", 1)]["val_ppl"] != records[Run("binary", 2)]["val_ppl"]
    assert records[Run("binary", 1)]["readings"]["sites"] == ["input", "block 0", "block 1"]
    assert (results / "loss_curves.png").stat().st_size > 10_000
    before = {p.name: p.read_bytes() for p in results.glob("*.json")}

    again = _study("--work-dir", work)  # nothing to do: every record has the current config hash
    assert again.returncode == 0 and f"trained 0 now, skipped {len(plan.runs)}" in again.stdout
    assert {p.name: p.read_bytes() for p in results.glob("*.json")} == before

    (results / "learned_s2.json").unlink()  # one record and its checkpoint lost: only that run is trained,
    shutil.rmtree(tmp_path / "checkpoints" / "learned_s2")  # from scratch, to the same numbers
    third = _study("--work-dir", work)
    assert third.returncode == 0 and f"trained 1 now, skipped {len(plan.runs) - 1}" in third.stdout
    redone = json.loads((results / "learned_s2.json").read_text())
    assert (redone["val_loss"], redone["val_ppl"]) == (
        records[Run("learned", 2)]["val_loss"],
        records[Run("learned", 2)]["val_ppl"],
    )

    check = _study("--work-dir", work, "--verify", "binary:1")
    assert check.returncode == 0 and "binary_s1: held-out PPL" in check.stdout and "reproduced" in check.stdout
    bad = _study("--work-dir", work, "--only", "binary:9")
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: run binary_s9 is not in the quick plan")
