"""The quickstart pipeline: the data stage (corpus, tokenizer, index) is deterministic and readable
by megatron-core; the whole pipeline in --quick mode trains both variants (slow)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from megatron.core.datasets.indexed_dataset import IndexedDataset

from megatron_fixedcode import quickstart_pipeline
from megatron_fixedcode.data.quickstart_corpus import stdlib_documents
from megatron_fixedcode.quickstart_pipeline import MIN_STEPS, choose_steps, main

ROOT = Path(__file__).resolve().parents[2]
DATA_ARGS = ["--data-only", "--corpus-mb", "0.3", "--vocab-size", "1024", "--valid-fraction", "0.2"]
OUTPUTS = [
    "corpus/corpus.jsonl",
    "tokenizer/tokenizer.json",
    "data/corpus_train_text_document.bin",
    "data/corpus_train_text_document.idx",
    "data/corpus_valid_text_document.bin",
    "data/corpus_valid_text_document.idx",
]


def digests(work: Path) -> dict[str, str]:
    return {name: hashlib.sha256((work / name).read_bytes()).hexdigest() for name in OUTPUTS}


def test_stdlib_corpus_is_sorted_prose_without_tests():
    docs = list(stdlib_documents(max_bytes=200_000))
    ids = [d["id"] for d in docs]
    assert len(ids) == len(set(ids)) > 10
    assert not any(".test." in i or i.startswith("test.") or "site-packages" in i for i in ids)
    assert sum(len(d["text"].encode()) for d in docs) >= 200_000
    assert docs == list(stdlib_documents(max_bytes=200_000))


@pytest.mark.slow
def test_data_stage_is_deterministic_and_megatron_readable(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main([*DATA_ARGS, "--work-dir", str(a)]) == 0
    assert main([*DATA_ARGS, "--work-dir", str(b)]) == 0
    assert digests(a) == digests(b)
    tokenizer = json.loads((a / "tokenizer/tokenizer.json").read_text())
    assert len(tokenizer["model"]["vocab"]) <= 1024
    assert (tokenizer["added_tokens"][0]["content"], tokenizer["added_tokens"][0]["id"]) == ("<|endoftext|>", 0)
    summary = json.loads((a / "data/corpus_summary.json").read_text())
    for split in ("train", "valid"):
        ds = IndexedDataset(str(a / f"data/corpus_{split}_text_document"))
        assert len(ds) == summary["documents"][split] > 0
        assert int(ds[0][-1]) == 0  # every document ends with EOD (id 0)


def test_user_corpus_and_tokenizer(tmp_path):
    base = tmp_path / "base"
    assert main([*DATA_ARGS, "--work-dir", str(base)]) == 0
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(30):
        (docs / f"note_{i:02d}.txt").write_text(f"Note {i}. " + "The fixed code replaces the table. " * (i + 5))
    (docs / "more.jsonl").write_text("".join(json.dumps({"text": f"record {i} " * 40}) + "\n" for i in range(30)))
    work = tmp_path / "user"
    rc = main(
        [
            "--data-only",
            "--work-dir",
            str(work),
            "--input",
            str(docs),
            "--valid-fraction",
            "0.3",
            "--tokenizer-model",
            str(base / "tokenizer/tokenizer.json"),
        ]
    )
    assert rc == 0
    summary = json.loads((work / "data/corpus_summary.json").read_text())
    assert sum(summary["documents"].values()) == 60
    assert not (work / "tokenizer").exists()


def test_missing_input_is_a_clean_error(tmp_path, capsys):
    assert main(["--data-only", "--work-dir", str(tmp_path), "--input", str(tmp_path / "nope")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_time_limit_chooses_one_step_count_before_training(tmp_path, monkeypatch, capsys):
    """A small time limit and a slow variant (the old quickstart cut it mid-cosine): the probe picks
    one step count, every variant's command carries it and no time cap, and the table says so."""
    base = tmp_path / "base"
    data = {"tokenizer_model": "tok.json", "train": "corpus_train_text_document", "valid": "corpus_valid_text_document"}
    order, commands = [], {}

    def probe(variant, data, args):
        order.append(("probe", variant))
        return {"binary": 0.5, "learned": 0.1}[variant]  # binary 5x slower, as with a cold kernel build

    def run(variant, data, args, steps):
        order.append(("train", variant))
        cmd = quickstart_pipeline.train_command(variant, data, args, steps)
        commands[variant] = cmd
        logs = Path(args.work_dir) / "logs" / variant
        logs.mkdir(parents=True, exist_ok=True)
        n = int(cmd[cmd.index("--train-iters") + 1])
        record = {"step": n, "tokens": n * 512, "loss": 5.0, "val_loss": 5.5}  # the trainer's last record
        (logs / "metrics.jsonl").write_text(json.dumps(record) + "\n")
        return 0

    monkeypatch.setattr(quickstart_pipeline, "build_data", lambda args: data)  # the data stage has its own tests
    monkeypatch.setattr(quickstart_pipeline, "build_kernel", lambda variants: order.append(("kernel", None)))
    monkeypatch.setattr(quickstart_pipeline, "probe_seconds_per_step", probe)
    monkeypatch.setattr(quickstart_pipeline, "run_variant", run)
    capsys.readouterr()
    rc = main(["--work-dir", str(base), "--minutes", "0.5", "--eval-iters", "3"])
    out = capsys.readouterr().out
    assert rc == 0, out
    # the kernel is built before any clock, and every probe runs before any variant trains
    assert order == [
        ("kernel", None),
        ("probe", "binary"),
        ("probe", "learned"),
        ("train", "binary"),
        ("train", "learned"),
    ]
    steps = choose_steps({"binary": 0.5, "learned": 0.1}, 0.5, 1000, 3)
    assert steps == (30 - 4 * 3 * 0.5 / 3) // 0.5 == 56  # the slowest variant's pace sets everyone's steps
    schedule = {
        v: [c[c.index(f) + 1] for f in ("--train-iters", "--eval-interval", "--config")] for v, c in commands.items()
    }
    assert schedule["binary"] == schedule["learned"] == [str(steps), str(steps // 4), schedule["binary"][2]]
    assert not any("--exit-duration-in-mins" in c for c in commands.values())
    assert f"equal budget: every variant trained {steps} steps ({steps * 512:,} targets)" in out
    # a tiny limit still trains everyone the same (floor) count; no limit: exactly --train-iters
    assert choose_steps({"binary": 30.0, "learned": 1.0}, 0.01, 1000, 20) == MIN_STEPS
    assert choose_steps({"binary": 0.5}, 0, 300, 20) == 300
    assert choose_steps({"binary": 30.0}, 0.01, 10, 20) == 10  # --train-iters stays the ceiling


@pytest.mark.slow
def test_quick_run_trains_both_variants(tmp_path):
    work = tmp_path / "qs"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "megatron_fixedcode.quickstart_pipeline",
            "--quick",
            *DATA_ARGS[1:],
            "--work-dir",
            str(work),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for variant in ("binary", "learned"):
        records = [json.loads(ln) for ln in (work / "logs" / variant / "metrics.jsonl").read_text().splitlines() if ln]
        assert records and any("val_ppl" in r for r in records), variant
        assert (work / "checkpoints" / variant).is_dir()
    table = out.stdout[out.stdout.rindex("val ppl") :]
    assert "binary" in table and "learned" in table
    assert "equal budget: every variant trained 6 steps" in table
