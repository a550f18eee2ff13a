"""Shard-parallel indexing: the paper's per-document split key, per-shard outputs
that resume, the dataset verifier and the manifest the trainer reads."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_fixedcode.data.preprocess import is_validation_document, output_prefix_for
from megatron_fixedcode.tokenizers import build_tokenizer, train_bpe_tokenizer
from tests.helpers import ASSETS, SMOLLM2
from tests.helpers.data import index_files, read_documents


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("bpe")
    (out / "train.txt").write_text(" ".join(f"doc t{i} word{i % 13}." for i in range(3000)), encoding="utf-8")
    return str(train_bpe_tokenizer([str(out / "train.txt")], 320, str(out / "tok")))


def test_split_key_is_id_where_present_else_text_per_document(tmp_path, small_tokenizer):
    """Paper 2: the id where a record has one, a hash of the text where it has none (null,
    empty or absent), decided per document; the summary counts both."""
    fraction, seed = 0.3, 11
    records = []
    for i in range(3000):
        record = {"text": f"t{i} word{i % 7}"}
        if i % 3 == 0:
            record["id"] = f"doc-{i}"
        elif i % 3 == 1:
            record["id"] = None if i % 2 else ""
        records.append(record)
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = index_files(tmp_path, [path], small_tokenizer, valid_fraction=fraction, split_seed=seed, id_key="id")
    assert summary["split_keys"] == {"id": 1000, "text": 2000}

    def key(r):
        return r["id"].encode() if r.get("id") else r["text"].encode()

    tok = build_tokenizer("HuggingFaceTokenizer", small_tokenizer)
    want_valid = [r["text"] for r in records if is_validation_document(key(r), seed, fraction)]
    got_valid = [
        tok.detokenize(d.tolist()) for d in read_documents(output_prefix_for(str(tmp_path / "out"), "valid", "text"))
    ]
    assert got_valid == want_valid
    # the id decides where there is one: the text hash alone gives another split of those records
    by_text = [r["text"] for r in records if is_validation_document(r["text"].encode(), seed, fraction)]
    assert got_valid != by_text
    assert summary["documents"]["valid"] + summary["documents"]["train"] == 3000
    no_id = index_files(tmp_path, [path], small_tokenizer, name="noid", valid_fraction=fraction, split_seed=seed)
    assert no_id["split_keys"] == {"id": 0, "text": 3000}


# --- tools/verify_dataset.py ---------------------------------------------------------------------


def _verify(capsys, *argv):
    from tools.verify_dataset import main

    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def indexed(tmp_path, small_tokenizer):
    """A two-split dataset from preprocess_data's library path, in its own directory."""
    path = tmp_path / "in.jsonl"
    path.write_text(
        "".join(
            json.dumps({"id": str(i), "text": " ".join(f"word{j % 13} t{i}" for j in range(i % 40 + 1))}) + "\n"
            for i in range(400)
        )
    )
    out = tmp_path / "idx"
    out.mkdir()
    summary = index_files(out, [path], small_tokenizer, name="shard", valid_fraction=0.2, append_eod=True)
    return out, summary


def test_verify_reports_counts_of_a_good_dataset(indexed, capsys):
    out, summary = indexed
    rc, stdout, _ = _verify(capsys, out, "--vocab-size", 320, "--seq-length", 30, "--json")
    assert rc == 0
    rows = {r["split"]: r for r in map(json.loads, stdout.splitlines())}
    for split in ("train", "valid"):
        docs = read_documents(output_prefix_for(str(out / "shard"), split, "text"))
        assert rows[split]["documents"] == len(docs) == summary["documents"][split]
        assert rows[split]["tokens"] == sum(map(len, docs)) == summary["tokens"][split]
        assert rows[split]["eligible_documents"] == sum(len(d) >= 31 for d in docs) > 0


@pytest.mark.parametrize(
    "damage", ["truncated_bin", "flipped_idx_size", "flipped_idx_header", "id_beyond_vocab", "summary_count"]
)
def test_verify_names_the_damaged_shard(indexed, capsys, damage):
    out, _ = indexed
    train = output_prefix_for(str(out / "shard"), "train", "text")
    valid = output_prefix_for(str(out / "shard"), "valid", "text")
    if damage == "truncated_bin":
        with open(train + ".bin", "r+b") as f:
            f.truncate(f.seek(0, 2) - 2)
    elif damage.startswith("flipped_idx"):
        data = bytearray(open(train + ".idx", "rb").read())
        data[34 + 4 * 3 if damage == "flipped_idx_size" else 2] ^= 0x01  # sequence 3's length / the magic
        open(train + ".idx", "wb").write(bytes(data))
    elif damage == "id_beyond_vocab":
        data = bytearray(open(train + ".bin", "rb").read())
        data[100:102] = (320).to_bytes(2, "little")  # uint16 token 50 = V
        open(train + ".bin", "wb").write(bytes(data))
    else:
        summary = json.loads((out / "shard_summary.json").read_text())
        summary["documents"]["train"] += 1
        (out / "shard_summary.json").write_text(json.dumps(summary))
    rc, stdout, stderr = _verify(capsys, out, "--vocab-size", 320)
    assert rc == 2
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {train}: "), stderr
    expected = {
        "truncated_bin": "truncated",
        "flipped_idx_size": "the index is damaged",
        "flipped_idx_header": "not a megatron-core index",
        "id_beyond_vocab": "id 320, outside the vocabulary",
        "summary_count": "its summary says",
    }[damage]
    assert expected in errors[0]
    assert f"ok {valid}:" in stdout  # the good shard is still reported


def _change_tokens_in_range(prefix: str, change: str, eod: int) -> None:
    """Rewrite a uint16 .bin in place, same size, every id still < V: only its content differs."""
    import numpy as np

    tokens = np.fromfile(prefix + ".bin", dtype=np.uint16)
    before = tokens.copy()
    if change == "reversed":
        tokens = tokens[::-1].copy()
    elif change == "one_token":
        tokens[50] = (tokens[50] + 1) % 300
    else:  # replaced with EOD
        tokens[10:60] = eod
    assert not np.array_equal(tokens, before) and int(tokens.max()) < 320
    tokens.tofile(prefix + ".bin")


@pytest.mark.parametrize("change", ["reversed", "one_token", "eod"])
def test_verify_names_a_bin_changed_in_range(indexed, small_tokenizer, capsys, change):
    """Tokens reversed, one changed or replaced with EOD (ids < V, same size)
    passed the verifier, which checked structure, counts and ids but never the .bin's content.
    Preprocessing records the .bin's sha256; the verifier names the shard whose .bin differs,
    given its directory, its summary or the prefix itself (with or without a vocabulary)."""
    from megatron_fixedcode.utils.files import file_sha256

    out, summary = indexed
    train = output_prefix_for(str(out / "shard"), "train", "text")
    valid = output_prefix_for(str(out / "shard"), "valid", "text")
    recorded = summary["outputs_sha256"][os.path.basename(train)]
    assert recorded["bin_sha256"] == file_sha256(train + ".bin") and recorded["idx_sha256"] == file_sha256(
        train + ".idx"
    )
    _change_tokens_in_range(train, change, build_tokenizer("HuggingFaceTokenizer", small_tokenizer).eod)
    for argv in ([out, "--vocab-size", 320], [out / "shard_summary.json"], [train, "--vocab-size", 320]):
        rc, stdout, stderr = _verify(capsys, *argv)
        errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
        assert rc == 2 and len(errors) == 1, (argv, stderr)
        assert errors[0].startswith(f"error: {train}: {train}.bin differs from the one its summary recorded"), stderr
    assert f"ok {valid}:" in _verify(capsys, out, "--vocab-size", 320)[1]  # the good shard still passes


def test_manifest_carries_the_bin_sha256_and_verify_checks_it(tmp_path, small_tokenizer, capsys):
    """The shard path's summaries, the manifest and a merge's summary carry each
    .bin's sha256; verify_dataset checks a manifest's shards against it. A shard indexed before
    the hash was recorded verifies with a note, not an error."""
    from megatron_fixedcode.data import shards
    from megatron_fixedcode.data.preprocess import merge_datasets
    from megatron_fixedcode.utils.files import file_sha256

    _write_shards(tmp_path / "in", n=2)
    shards.run_task(_plan(tmp_path, [tmp_path / "in"], small_tokenizer, shards_per_task=2), 0)
    out = tmp_path / "out"
    assert _write_manifest_cli(out) == 0
    capsys.readouterr()
    manifest = json.loads((out / "manifest.json").read_text())
    for entry in manifest["shards"]:
        for split in ("train", "valid"):
            prefix = str(out / entry[split]["prefix"])
            assert entry[split]["bin_sha256"] == file_sha256(prefix + ".bin")
            assert entry[split]["idx_sha256"] == file_sha256(prefix + ".idx")
    rc, stdout, stderr = _verify(capsys, out / "manifest.json", "--vocab-size", 320)
    assert rc == 0 and stdout.count("ok ") == 4 and "note: " not in stderr, stderr
    # a merge records its output's hash too, and the output verifies against it
    merged = merge_datasets(
        [str(out / "part-000_train_text_document"), str(out / "part-001_train_text_document")], str(tmp_path / "merged")
    )
    assert merged["outputs_sha256"]["merged"]["bin_sha256"] == file_sha256(tmp_path / "merged.bin")
    assert _verify(capsys, tmp_path / "merged")[0] == 0
    _change_tokens_in_range(str(tmp_path / "merged"), "one_token", 0)
    rc, _, stderr = _verify(capsys, tmp_path / "merged")
    assert rc == 2 and f"error: {tmp_path / 'merged'}: " in stderr and ".bin differs" in stderr

    damaged = str(out / "part-001_valid_text_document")
    _change_tokens_in_range(damaged, "reversed", 0)
    rc, _, stderr = _verify(capsys, out / "manifest.json", "--vocab-size", 320)
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert (
        rc == 2
        and len(errors) == 1
        and errors[0].startswith(
            f"error: {damaged}: {damaged}.bin differs from the one manifest {out / 'manifest.json'} recorded"
        )
    )
    # indexed before .bin hashes were recorded: still verified (structure, counts, .idx hash), with a note
    for entry in manifest["shards"]:
        for split in ("train", "valid"):
            del entry[split]["bin_sha256"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    rc, _, stderr = _verify(capsys, out / "manifest.json", "--vocab-size", 320)
    assert (
        rc == 0 and "note: 4 of 4 shards verified without a recorded .bin sha256" in stderr and "error" not in stderr
    ), stderr


@pytest.mark.slow
def test_verify_a_prefix_beside_megatrons_index_cache(indexed, capsys):
    """Once a run trained on a prefix, megatron's GPT index cache makes PREFIX/
    a directory (PREFIX/cache/GPTDataset_indices); verify_dataset took it for a shard directory
    ("no .bin/.idx pairs matching '*'", naming a flag it lacks). The prefix, its .idx, its
    directory and a merge of it verify; a path holding no dataset names no flag."""
    from megatron_fixedcode.data.preprocess import merge_datasets
    from tests.helpers.pretrain import pretrain

    out, _ = indexed
    train = output_prefix_for(str(out / "shard"), "train", "text")
    pretrain(
        "--dataset-type", "gpt", "--train-iters", "1", "--eval-iters", "1", "--split", "100,0,0", "--data-path", train
    )
    assert list(Path(train, "cache").iterdir())  # megatron's cache, named like the prefix
    for path in (train, train + ".idx", out):
        rc, stdout, stderr = _verify(capsys, path, "--vocab-size", 320)
        assert rc == 0 and f"ok {train}:" in stdout and "error" not in stderr, (path, stderr)
        assert "without a recorded .bin sha256" not in stderr  # the summary beside the prefix vouches for its content
    assert merge_datasets([train], str(out / "merged"))["documents"] > 0  # the same discovery
    (out / "empty").mkdir()
    rc, _, stderr = _verify(capsys, out / "empty")
    assert rc == 2 and stderr.strip().splitlines()[-1] == (
        f"error: {out / 'empty'}: not a dataset: no {out / 'empty'}.bin/.idx, and no *_summary.json or .bin/.idx "
        "pairs in this directory"
    )


def test_verify_without_a_vocabulary_runs_the_structural_checks(indexed, capsys):
    """Without --vocab-size (or a tokenizer) the verifier refused to run; it now
    checks structure, counts and hashes (ids only when given V), and says ids went unchecked."""
    out, _ = indexed
    train = output_prefix_for(str(out / "shard"), "train", "text")
    rc, stdout, stderr = _verify(capsys, out)
    assert rc == 0 and stdout.count("ok ") == 2 and "note: token ids were not checked" in stderr
    data = bytearray(open(train + ".idx", "rb").read())
    data[34 + 4 * 3] ^= 0x01  # sequence 3's length
    open(train + ".idx", "wb").write(bytes(data))
    rc, _, stderr = _verify(capsys, train)
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert (
        rc == 2 and len(errors) == 1 and errors[0].startswith(f"error: {train}: ") and "index is damaged" in errors[0]
    )


# --- per-shard, resumable indexing (megatron_fixedcode/data/shards.py) ----------------------------


def _write_shards(directory, n=4, docs=60):
    """JSONL, JSONL.gz and Parquet shards with ids (one shard without), plus the records."""
    import gzip

    import pyarrow
    import pyarrow.parquet

    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(n):
        records = [
            {"id": f"s{s}d{i}", "text": " ".join(f"word{(i * j) % 13} t{s}" for j in range(i % 30 + 1))}
            for i in range(docs)
        ]
        if s == 1:
            records = [{"text": r["text"]} for r in records]
        if s % 3 == 0:
            path = directory / f"part-{s:03d}.parquet"
            pyarrow.parquet.write_table(pyarrow.Table.from_pylist(records), path)
        else:
            path = directory / f"part-{s:03d}.jsonl.gz"
            with gzip.open(path, "wt") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)
        paths.append(path)
    return paths


def _plan(tmp_path, inputs, tokenizer, **kw):
    from megatron_fixedcode.data import shards

    plan = shards.make_plan(
        [str(i) for i in inputs],
        str(tmp_path / "out"),
        "HuggingFaceTokenizer",
        tokenizer,
        **{"append_eod": True, "id_key": "id", "valid_fraction": 0.1, **kw},
    )
    shards.write_plan(plan)
    return plan


def _output_bytes(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.suffix in (".bin", ".idx")}


def test_shard_tasks_match_one_process_per_shard_and_resume(tmp_path, small_tokenizer):
    from megatron_fixedcode.data import shards

    inputs = _write_shards(tmp_path / "in", n=5)
    plan = _plan(tmp_path, [tmp_path / "in"], small_tokenizer, shards_per_task=2)
    assert plan["num_tasks"] == 3 and [len(shards.task_inputs(plan, i)) for i in range(3)] == [2, 2, 1]
    reports = [shards.run_task(plan, i) for i in range(3)]
    assert sorted(n for r in reports for n in r["done"]) == [f"part-{s:03d}" for s in range(5)]
    # byte-identical to preprocess_data's library path, one process per shard
    (tmp_path / "ref").mkdir()
    for path in inputs:
        index_files(
            tmp_path / "ref",
            [path],
            small_tokenizer,
            name=shards.shard_name(path),
            append_eod=True,
            id_key="id",
            valid_fraction=0.1,
        )
    got, want = _output_bytes(tmp_path / "out"), _output_bytes(tmp_path / "ref")
    assert len(got) == 5 * 2 * 2 and got == want
    summary = json.loads((tmp_path / "out" / "part-001_summary.json").read_text())
    assert (
        summary["split_keys"] == {"id": 0, "text": 60} and summary["shard"]["input_bytes"] == inputs[1].stat().st_size
    )
    # a re-run skips every complete shard without touching it
    mtimes = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").iterdir()}
    assert [shards.run_task(plan, i)["skipped"] for i in range(3)] == [
        ["part-000", "part-001"],
        ["part-002", "part-003"],
        ["part-004"],
    ]
    assert mtimes == {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").iterdir()}
    # an input changed since (mtime), a summary without its shard record (killed while finishing),
    # a damaged .idx: each shard is redone, the others skipped
    os.utime(inputs[0], ns=(inputs[0].stat().st_atime_ns, inputs[0].stat().st_mtime_ns + 10**9))
    s2 = tmp_path / "out" / "part-002_summary.json"
    record = json.loads(s2.read_text())
    del record["shard"]
    s2.write_text(json.dumps(record))
    idx = tmp_path / "out" / "part-004_train_text_document.idx"
    idx.write_bytes(idx.read_bytes()[:-8] + bytes(8))
    fp = build_tokenizer("HuggingFaceTokenizer", small_tokenizer).fingerprint
    status = shards.plan_status(plan, fp)
    assert {n: s for n, (s, _) in status.items()} == {
        "part-000": "stale",
        "part-001": "done",
        "part-002": "stale",
        "part-003": "done",
        "part-004": "stale",
    }
    reports = [shards.run_task(plan, i) for i in range(3)]
    assert [r["done"] for r in reports] == [["part-000"], ["part-002"], ["part-004"]]
    assert _output_bytes(tmp_path / "out") == want
    assert all(s == "done" for s, _ in shards.plan_status(plan, fp).values())


def test_bad_shard_is_recorded_by_name_and_the_task_goes_on(tmp_path, small_tokenizer):
    from megatron_fixedcode.data import shards

    _write_shards(tmp_path / "in", n=3)
    bad = tmp_path / "in" / "part-001.jsonl.gz"
    bad.write_bytes(bad.read_bytes()[:-20])  # truncated gzip
    plan = _plan(tmp_path, [tmp_path / "in"], small_tokenizer, shards_per_task=3)
    report = shards.run_task(plan, 0)
    assert report["done"] == ["part-000", "part-002"] and list(report["failed"]) == ["part-001"]
    assert str(bad) in report["failed"]["part-001"] and "gzip" in report["failed"]["part-001"]
    fp = build_tokenizer("HuggingFaceTokenizer", small_tokenizer).fingerprint
    assert shards.plan_status(plan, fp)["part-001"][0] == "failed"
    assert not list((tmp_path / "out").glob("part-001*.idx")) and not list((tmp_path / "out").glob("*.tmp"))


# --- manifest.json and the trainer's --data-manifest / --data-args-path ---------------------------

TINY = Path(__file__).resolve().parents[2] / "examples" / "recipes" / "tiny_cpu.yaml"


def _write_manifest_cli(*argv):
    from tools.write_manifest import main

    return main([str(a) for a in argv])


def _trainer_args(*argv):
    from megatron_fixedcode.arguments.parse import parse_pretrain_args

    return parse_pretrain_args(["--config", str(TINY), "--dry-run", *map(str, argv)]).args


def test_manifest_refuses_incomplete_lists_good_shards_and_feeds_the_trainer(tmp_path, small_tokenizer, capsys):
    from megatron_fixedcode.data import shards

    _write_shards(tmp_path / "in", n=4)
    bad = tmp_path / "in" / "part-002.jsonl.gz"
    bad.write_bytes(b"\x1f\x8b not gzip")
    plan = _plan(tmp_path, [tmp_path / "in"], small_tokenizer, shards_per_task=2)
    out = tmp_path / "out"
    shards.run_task(plan, 0)
    assert _write_manifest_cli(out) == 2
    err = capsys.readouterr().err
    assert "2 of 4 shards are not complete: part-002 (missing), part-003 (missing)" in err
    shards.run_task(plan, 1)
    assert _write_manifest_cli(out) == 2 and "part-002" in capsys.readouterr().err  # failed: refused
    assert not (out / "manifest.json").exists()
    assert _write_manifest_cli(out, "--skip-failed") == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert [s["name"] for s in manifest["shards"]] == ["part-000", "part-001", "part-003"]
    assert [e["name"] for e in manifest["excluded"]] == ["part-002"]
    fp = build_tokenizer("HuggingFaceTokenizer", small_tokenizer).fingerprint
    assert manifest["tokenizer"]["fingerprint"] == fp
    assert manifest["split"]["valid_fraction"] == 0.1 and manifest["split"]["id_key"] == "id"
    for entry in manifest["shards"]:
        summary = json.loads((out / f"{entry['name']}_summary.json").read_text())
        for split in ("train", "valid"):
            docs = read_documents(str(out / entry[split]["prefix"]))
            assert entry[split]["documents"] == len(docs) == summary["documents"][split]
            assert entry[split]["tokens"] == sum(map(len, docs))
    # a damaged output after the fact: refused naming the shard
    idx = out / "part-003_train_text_document.idx"
    saved = idx.read_bytes()
    idx.write_bytes(saved[:-4])
    assert _write_manifest_cli(out, "--skip-failed", "--output", tmp_path / "m2.json") == 2
    assert "part-003" in capsys.readouterr().err
    idx.write_bytes(saved)

    # the trainer: one manifest = its prefixes; --data-args-path = the same list from a file
    direct = [str(out / s["train"]["prefix"]) for s in manifest["shards"]]
    valid = [str(out / s["valid"]["prefix"]) for s in manifest["shards"] if s["valid"]["documents"]]
    a = _trainer_args("--data-manifest", out / "manifest.json", "--tokenizer-model", small_tokenizer)
    assert a.train_data_path == direct and a.valid_data_path == valid
    (tmp_path / "data_args.txt").write_text(" ".join(direct) + "\n")
    assert _trainer_args("--data-args-path", tmp_path / "data_args.txt", "--vocab-size", 320).data_path == direct
    # a blend of two manifests, 0.8 / 0.2, each shard weighted by its share of its manifest's tokens
    a = _trainer_args(
        "--data-manifest",
        out / "manifest.json",
        out / "manifest.json",
        "--data-manifest-weights",
        0.8,
        0.2,
        "--tokenizer-model",
        small_tokenizer,
    )
    weights = [float(w) for w in a.train_data_path[0::2]]
    tokens = [s["train"]["tokens"] for s in manifest["shards"]]
    assert a.train_data_path[1::2] == direct * 2
    assert weights == pytest.approx([0.8 * t / sum(tokens) for t in tokens] + [0.2 * t / sum(tokens) for t in tokens])


def test_trainer_refuses_a_manifest_of_another_tokenizer(tmp_path, small_tokenizer):
    from megatron_fixedcode.data import shards

    _write_shards(tmp_path / "in", n=1)
    shards.run_task(_plan(tmp_path, [tmp_path / "in"], small_tokenizer), 0)
    assert _write_manifest_cli(tmp_path / "out") == 0
    other = SMOLLM2
    manifest = tmp_path / "out" / "manifest.json"
    cmd = [
        sys.executable,
        "-m",
        "megatron_fixedcode.pretrain",
        "--config",
        str(TINY),
        "--dry-run",
        "--data-manifest",
        str(manifest),
        "--tokenizer-model",
        str(other),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    error = out.stderr.strip().splitlines()[-1]
    assert error.startswith("python -m megatron_fixedcode.pretrain: error: --data-manifest ") and "fingerprint" in error
    assert "Traceback" not in out.stderr
    for flags in (["--data-path", "x"], ["--data-manifest-weights", "1", "2"]):
        out = subprocess.run(cmd + flags, capture_output=True, text=True, timeout=300)
        assert out.returncode == 2 and "Traceback" not in out.stderr


def test_launchers_take_the_manifest_paper2_and_paper1_blend(tmp_path, small_tokenizer):
    """DATA_MANIFEST (paper 2) and two manifests weighted 0.8 / 0.2 (paper 1, replacing the
    recipe's blend) reach the trainer as one flag each; the resolved config holds the shards."""
    from megatron_fixedcode.data import shards
    from tests.helpers.launchers import launcher_env, run_dry

    manifests = []
    for corpus in ("fwe", "cosmo"):
        _write_shards(tmp_path / corpus / "in", n=2)
        plan = _plan(tmp_path / corpus, [tmp_path / corpus / "in"], small_tokenizer, shards_per_task=2)
        shards.run_task(plan, 0)
        assert _write_manifest_cli(tmp_path / corpus / "out") == 0
        manifests.append(json.loads((tmp_path / corpus / "out" / "manifest.json").read_text()))
    fwe, cosmo = (str(tmp_path / c / "out" / "manifest.json") for c in ("fwe", "cosmo"))
    env = launcher_env(tmp_path, DATA_MANIFEST=fwe, TOKENIZER=small_tokenizer)
    del env["DATA_PATH"], env["VALID_DATA_PATH"]
    command, config, _ = run_dry("pretrain_1p7b_fixedcode.sh", [], env)
    assert command[command.index("--data-manifest") + 1] == fwe and "--data-path" not in command
    assert config["train_data_path"] == [
        str(tmp_path / "fwe" / "out" / s["train"]["prefix"]) for s in manifests[0]["shards"]
    ]
    env.update(DATA_MANIFEST=f"{fwe} {cosmo}", DATA_MANIFEST_WEIGHTS="0.8 0.2")
    command, config, _ = run_dry("pretrain_paper1.sh", ["binary"], env)
    weights = [float(w) for w in config["train_data_path"][0::2]]
    assert sum(weights[:2]) == pytest.approx(0.8) and sum(weights[2:]) == pytest.approx(0.2)
    assert all("cosmo" in p for p in config["train_data_path"][1::2][2:]) and "${" not in json.dumps(config)


def test_verify_checks_the_recorded_idx_hash_of_shard_outputs(tmp_path, small_tokenizer, capsys):
    """A flipped byte that keeps the index self-consistent (a document boundary moved by one)
    is still caught for shards written by the shard path: their summary records the .idx sha256."""
    from megatron_fixedcode.data import shards

    _write_shards(tmp_path / "in", n=1)
    shards.run_task(_plan(tmp_path, [tmp_path / "in"], small_tokenizer, valid_fraction=0.0), 0)
    out = tmp_path / "out"
    rc, stdout, _ = _verify(capsys, out, "--vocab-size", 320, "--seq-length", 10)
    assert rc == 0 and "ok " in stdout
    prefix = str(out / "part-000_train_text_document")
    data = bytearray(open(prefix + ".idx", "rb").read())
    n_seq = int.from_bytes(data[18:26], "little")
    doc5 = 34 + n_seq * 12 + 5 * 8  # document bound 5 (between 4 and 6): +1 keeps them non-decreasing
    data[doc5] += 1
    open(prefix + ".idx", "wb").write(bytes(data))
    rc, _, stderr = _verify(capsys, out, "--vocab-size", 320)
    assert rc == 2 and f"error: {prefix}: " in stderr and "sha256" in stderr


@pytest.mark.slow
def test_shard_benchmark_reports_both_paths_on_the_same_tokens(tmp_path):
    from benchmarks.preprocess_shards import main

    out = tmp_path / "bench.json"
    assert (
        main(
            [
                "--corpus-dir",
                str(ASSETS / "corpus"),
                "--tokenizer-model",
                str(SMOLLM2),
                "--shards",
                "4",
                "--tasks",
                "2",
                "--repeat",
                "1",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    assert result["tokens"] > 100_000 and result["array_tasks"] == 2
    for path in ("one_process", "array"):
        r = result[path]
        assert r["tokens_per_s_per_core"] == pytest.approx(result["tokens"] / r["seconds"] / result["cores"], rel=1e-3)


def test_shard_locked_by_another_task_is_left_to_it_not_failed(tmp_path, small_tokenizer):
    from megatron_fixedcode.data import shards
    from megatron_fixedcode.utils.locks import lock_output_prefix

    _write_shards(tmp_path / "in", n=2)
    plan = _plan(tmp_path, [tmp_path / "in"], small_tokenizer, shards_per_task=2)
    (tmp_path / "out").mkdir(exist_ok=True)
    with lock_output_prefix(str(tmp_path / "out" / "part-000")):
        report = shards.run_task(plan, 0)
    assert report["busy"] == ["part-000"] and report["done"] == ["part-001"] and not report["failed"]
    assert not (tmp_path / "out" / "part-000_failed.json").exists()
    assert shards.run_task(plan, 0)["done"] == ["part-000"]


def test_array_spec_of_the_tasks_to_resubmit():
    from megatron_fixedcode.data.shards import array_spec

    assert array_spec([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8" and array_spec([3]) == "3" and array_spec([]) == ""


def test_gpt2_bpe_files_through_every_data_tool(tmp_path, capsys):
    """Megatron-LM's GPT-2 tokenizer flags (--tokenizer-type GPT2BPETokenizer --vocab-file --merge-file) in the
    shard tools as in tools/preprocess_data.py: the array tasks' outputs equal it byte for byte, status and the
    manifest use the same tokenizer, the trainer takes the manifest with the same flags and refuses it with
    another merges.txt, and tools/verify_dataset.py checks every id against the GPT-2 vocabulary."""
    from megatron_fixedcode.cli import preprocess_data, preprocess_shards, verify_dataset
    from megatron_fixedcode.data.shards import shard_name
    from tests.helpers import write_gpt2_bpe_files

    vocab, merges = write_gpt2_bpe_files(tmp_path / "gpt2")
    inputs = _write_shards(tmp_path / "in", n=3)
    tok = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", str(vocab), "--merge-file", str(merges)]
    shaping = ["--append-eod", "--id-key", "id", "--valid-fraction", "0.1"]
    out = tmp_path / "out"
    assert (
        preprocess_shards.main(
            [
                "plan",
                "--input",
                str(tmp_path / "in"),
                "--output-dir",
                str(out),
                *tok,
                "--shards-per-task",
                "2",
                *shaping,
            ]
        )
        == 0
    )
    assert [preprocess_shards.main(["task", "--output-dir", str(out), "--task-id", str(i)]) for i in (0, 1)] == [0, 0]
    assert preprocess_shards.main(["status", "--output-dir", str(out)]) == 0
    assert capsys.readouterr().out.count("done ") == 3
    for path in inputs:
        prefix = tmp_path / "ref" / shard_name(path)
        assert preprocess_data.main(["--input", str(path), "--output-prefix", str(prefix), *tok, *shaping]) == 0
    got = _output_bytes(out)
    assert len(got) == 3 * 2 * 2 and got == _output_bytes(tmp_path / "ref")

    assert _write_manifest_cli(out) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    gpt2 = build_tokenizer("GPT2BPETokenizer", str(vocab), merge_file=str(merges))
    assert manifest["tokenizer"]["fingerprint"] == gpt2.fingerprint
    assert _trainer_args("--data-manifest", out / "manifest.json", *tok).train_data_path == [
        str(out / s["train"]["prefix"]) for s in manifest["shards"]
    ]
    other = tmp_path / "other_merges.txt"
    other.write_text("".join(merges.read_text().splitlines(keepends=True)[:-1]))  # one merge fewer
    with pytest.raises(SystemExit) as e:
        _trainer_args("--data-manifest", out / "manifest.json", *tok[:-1], other)
    assert e.value.code == 2 and "fingerprint" in capsys.readouterr().err

    assert verify_dataset.main([str(out), *tok]) == 0
    assert "not checked" not in capsys.readouterr().err
    top = max(max(map(max, read_documents(str(out / s["train"]["prefix"])))) for s in manifest["shards"])
    assert top == gpt2.eod  # <|endoftext|>, the last id, closes every document
    assert verify_dataset.main([str(out), "--vocab-size", str(top)]) == 2  # ids checked: the last id is out of range
