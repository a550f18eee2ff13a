"""A full disk while indexing: one line naming the outputs and the free space, exit code 2, no
traceback; what was complete before stays, the partial outputs are .tmp files only."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.disk import small_tmpfs
from tests.helpers import ASSETS, REPO, SMOLLM2


@pytest.fixture
def full_disk(tmp_path):
    """A 160 KiB tmpfs: room for a plan, not for the tokens of two Gutenberg books."""
    with small_tmpfs(tmp_path / "small-disk", "160k") as mount:
        yield mount


def _corpus(directory):
    directory.mkdir()
    path = directory / "books.jsonl"
    with open(path, "w") as f:
        for i, book in enumerate(sorted((ASSETS / "corpus" / "gutenberg").glob("*.txt"))):
            f.write(json.dumps({"id": f"b{i}", "text": book.read_text(encoding="utf-8", errors="replace")}) + "\n")
    return path


def _run(*args):
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def _one_line(proc) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return errors[0]


def test_preprocess_data_on_a_full_disk(tmp_path, full_disk):
    corpus = _corpus(tmp_path / "in")
    proc = _run(
        str(REPO / "tools" / "preprocess_data.py"),
        "--input",
        str(corpus),
        "--output-prefix",
        str(full_disk / "books"),
        "--tokenizer-type",
        "HuggingFaceTokenizer",
        "--tokenizer-model",
        str(SMOLLM2),
        "--append-eod",
    )
    line = _one_line(proc)
    assert (
        line.startswith(f"error: no space left on device writing {full_disk / 'books'}_* (")
        and "MiB free there" in line
    )
    assert not [p for p in full_disk.iterdir() if p.name.endswith((".bin", ".idx", "_summary.json"))]


def test_shard_indexing_task_on_a_full_disk(tmp_path, full_disk):
    _corpus(tmp_path / "in")
    out = full_disk / "idx"
    tool = ["-m", "megatron_fixedcode.cli.preprocess_shards"]
    plan = _run(
        *tool,
        "plan",
        "--input",
        str(tmp_path / "in"),
        "--output-dir",
        str(out),
        "--tokenizer-type",
        "HuggingFaceTokenizer",
        "--tokenizer-model",
        str(SMOLLM2),
        "--append-eod",
        "--id-key",
        "id",
    )
    assert plan.returncode == 0, plan.stderr[-3000:]
    line = _one_line(_run(*tool, "task", "--output-dir", str(out), "--task-id", "0"))
    assert line.startswith(f"error: task 0: no space left on device writing {out / 'books'}_* ("), line
    assert not (out / "books_summary.json").exists() and not (out / "books_failed.json").exists()


def test_a_full_disk_at_a_shard_record_names_it_and_leaves_no_partial_record(tmp_path):
    from megatron_fixedcode.data.shards import _write_json
    from megatron_fixedcode.utils.files import DiskFull

    with small_tmpfs(tmp_path / "disk", "4k") as disk:
        (disk / "x_summary.json").write_text('{"old": 1}\n')
        with pytest.raises(DiskFull) as e:
            _write_json(disk / "x_summary.json", {"pad": "p" * 8192})
        assert str(e.value).startswith(f"no space left on device writing {disk / 'x_summary.json'} (")
        assert "x_summary.json is as it was (a shard without its summary is indexed again)" in str(e.value)
        assert sorted(p.name for p in disk.iterdir()) == ["x_summary.json"]
        assert (disk / "x_summary.json").read_text() == '{"old": 1}\n'


@pytest.mark.slow
def test_a_full_disk_for_the_dataset_index_cache_is_one_line(tmp_path):
    """megatron's GPT dataset writes its sample index cache at start-up (--data-cache-path): a full disk
    there is one line naming the file and the free space, exit 2, before any step."""
    from tests.helpers.pretrain import data_args, pretrain, write_corpus

    corpus = write_corpus(tmp_path)
    with small_tmpfs(tmp_path / "cache", "4k") as cache:
        proc = pretrain(*data_args(corpus, "gpt"), "--train-iters", "2", "--data-cache-path", str(cache), check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith(("ERROR:", "error: "))]
    assert len(errors) == 1 and f"no space left on device writing {cache}" in errors[0], proc.stderr[-3000:]
    assert "the index cache is rebuilt at the next start" in errors[0]
