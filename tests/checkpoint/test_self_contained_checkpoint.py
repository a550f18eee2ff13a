"""A checkpoint carries what it needs: the run's tokenizer, copied once into the checkpoint root
(``SAVE/tokenizer/<hash>/``, covered by every checkpoint's checksums, never pruned), and its resolved
flags (``iter_N/run_config.json``, as ``--dry-run`` prints them). Export, evaluation, analysis and
``--finetune`` work from ``--load`` alone after the run was moved and its tokenizer deleted; an explicit
tokenizer other than the carried one is refused naming both."""

import json
import shutil
from pathlib import Path

import pytest

from megatron_fixedcode import checkpoint
from megatron_fixedcode.pretrain import main as pretrain_main
from megatron_fixedcode.tokenizers import build_tokenizer, checkpoint_tokenizer_files
from tests.helpers import SMOLLM2
from tests.helpers.errors import one_line_error, refused
from tests.helpers.pretrain import TINY_TOKENIZER_VOCAB, data_args, pretrain, write_corpus

pytestmark = pytest.mark.slow
TEXT = "The quick brown fox jumps over the lazy dog. " * 20


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Three steps saved (keep_last 2 prunes step 1) with a scratch copy of the SmolLM2 tokenizer; then
    the checkpoint directory is moved and the scratch tokenizer deleted."""
    root = tmp_path_factory.mktemp("self_contained")
    tok = root / "scratch_tok"
    shutil.copytree(SMOLLM2, tok)
    (root / "corpus").mkdir()
    corpus = write_corpus(root / "corpus")
    flags = [
        "--train-iters",
        "3",
        "--save-interval",
        "1",
        "--ckpt-keep-last",
        "2",
        "--tokenizer-model",
        str(tok),
        "--save",
        str(root / "ckpt"),
        *data_args(corpus, "gpt"),
    ]
    pretrain(*flags, base=TINY_TOKENIZER_VOCAB)
    moved = root / "elsewhere" / "run"
    moved.parent.mkdir()
    shutil.move(root / "ckpt", moved)
    shutil.rmtree(tok)
    return {
        "root": root,
        "ckpt": moved,
        "tok": str(tok),
        "flags": flags,
        "corpus": corpus,
        "reference": build_tokenizer("HuggingFaceTokenizer", str(SMOLLM2)),
    }


def _record(run, step=3):
    return checkpoint.read_trainer_state(str(run["ckpt"]), step)["tokenizer"]


def test_the_tokenizer_is_carried_once_and_covered_by_the_checksums(run):
    record = _record(run)
    folder = run["ckpt"] / record["copy"]["dir"]
    assert record["model"] == run["tok"] and record["fingerprint"] == run["reference"].fingerprint
    assert [p.name for p in (run["ckpt"] / "tokenizer").iterdir()] == [folder.name]  # one copy for the run
    assert (folder / "tokenizer.json").read_bytes() == (SMOLLM2 / "tokenizer.json").read_bytes()
    # keep_last 2 pruned step 1, never the shared tokenizer folder; both checkpoints name the same copy
    assert sorted(p.name for p in run["ckpt"].glob("iter_*")) == ["iter_0000002", "iter_0000003"]
    assert _record(run, 2)["copy"] == record["copy"]
    for step in (2, 3):
        target = checkpoint.checkpoint_dir(run["ckpt"], step)
        manifest = json.loads((target / checkpoint.CHECKSUMS).read_text())
        assert checkpoint.RUN_CONFIG in manifest["files"]
        assert set(manifest["shared"]) == {f"../{name}" for name in record["copy"]["files"]}
        assert checkpoint.verified_step(run["ckpt"], step) == step  # verifies where it lies now


def test_changed_carried_tokenizer_bytes_are_refused(run, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(run["ckpt"], ckpt)
    carried = ckpt / _record(run)["copy"]["model"]
    carried.write_text(carried.read_text().replace("quick", "quack", 1) + " ")
    with pytest.raises(checkpoint.CorruptCheckpoint, match="tokenizer.json"):
        checkpoint.verified_step(ckpt, 3)


def test_run_config_is_the_dry_runs_json(run, capsys):
    assert pretrain_main([*TINY_TOKENIZER_VOCAB, *run["flags"], "--dry-run"]) == 0
    dry = json.loads(capsys.readouterr().out.splitlines()[0])
    saved = json.loads((checkpoint.checkpoint_dir(run["ckpt"], 3) / checkpoint.RUN_CONFIG).read_text())
    assert saved == dry and saved["tokenizer_model"] == run["tok"]
    assert saved == checkpoint.read_trainer_state(str(run["ckpt"]), 3)["run_config"]


def test_export_evaluate_and_analysis_from_load_alone(run, tmp_path, capsys):
    from transformers import AutoTokenizer

    from megatron_fixedcode.analysis.run import AnalysisConfig, run_analysis
    from megatron_fixedcode.cli import convert_checkpoint_to_hf, evaluate

    assert convert_checkpoint_to_hf.main(["--load", str(run["ckpt"]), "--output", str(tmp_path / "hf")]) == 0
    hf_ids = AutoTokenizer.from_pretrained(tmp_path / "hf")(TEXT, add_special_tokens=False)["input_ids"]
    assert hf_ids == run["reference"].tokenize(TEXT)
    text = tmp_path / "doc.txt"
    text.write_text(TEXT)
    argv = ["--load", str(run["ckpt"]), "--text-files", str(text), "--output", str(tmp_path / "e.json")]
    assert evaluate.main(argv) == 0
    result = json.loads((tmp_path / "e.json").read_text())
    assert result["tokenizer"]["model"].startswith(str(run["ckpt"] / "tokenizer"))
    assert result["tokenizer"]["fingerprint"] == run["reference"].fingerprint
    report = run_analysis(
        AnalysisConfig(
            load=str(run["ckpt"]),
            output_dir=str(tmp_path / "analysis"),
            data_path=run["corpus"][1],
            num_windows=4,
            probe_classes=4,
        )
    )
    assert report["step"] == 3
    capsys.readouterr()


def _other_tokenizer(root: Path) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<|endoftext|>": 0, **{f"w{i}": i + 1 for i in range(99)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    root.mkdir()
    tok.save(str(root / "tokenizer.json"))
    return str(root)


def test_another_explicit_tokenizer_is_refused_naming_both(run, tmp_path, capsys):
    from megatron_fixedcode.cli import convert_checkpoint_to_hf, evaluate

    other = _other_tokenizer(tmp_path / "other")
    carried = str(run["ckpt"] / _record(run)["copy"]["model"])
    argv = ["--load", str(run["ckpt"]), "--tokenizer-model", other]
    assert convert_checkpoint_to_hf.main([*argv, "--output", str(tmp_path / "hf")]) == 2
    one_line_error(capsys, f"--tokenizer-model {other}", carried, "is not the tokenizer")
    assert not (tmp_path / "hf").exists()
    text = tmp_path / "doc.txt"
    text.write_text(TEXT)
    assert evaluate.main([*argv, "--text-files", str(text)]) == 2
    one_line_error(capsys, f"--tokenizer-model {other}", carried)
    # the same tokenizer given explicitly is accepted (another copy of the same bytes)
    same = tmp_path / "same"
    shutil.copytree(SMOLLM2, same)
    assert (
        convert_checkpoint_to_hf.main(
            ["--load", str(run["ckpt"]), "--tokenizer-model", str(same), "--output", str(tmp_path / "hf2")]
        )
        == 0
    )


def test_finetune_from_load_alone_uses_and_carries_the_checkpoints_tokenizer(run, tmp_path):
    proc = pretrain(
        "--train-iters",
        "1",
        "--finetune",
        "--load",
        str(run["ckpt"]),
        "--save",
        str(tmp_path / "ft"),
        *data_args(run["corpus"], "gpt"),
        base=TINY_TOKENIZER_VOCAB,
    )
    assert "tokenizer: the checkpoint's own" in proc.stdout + proc.stderr
    record = checkpoint.read_trainer_state(str(tmp_path / "ft"), 1)["tokenizer"]
    assert record["copy"]["dir"] == _record(run)["copy"]["dir"]
    assert (tmp_path / "ft" / record["copy"]["model"]).is_file()
    assert record["fingerprint"] == run["reference"].fingerprint


def test_finetune_with_load_naming_no_tokenizer_is_refused_in_one_line(tmp_path):
    (tmp_path / "corpus").mkdir()
    corpus = write_corpus(tmp_path / "corpus")
    pretrain("--train-iters", "1", "--save", str(tmp_path / "a"), *data_args(corpus, "gpt"))  # --vocab-size 1024
    proc = pretrain(
        "--train-iters",
        "1",
        "--finetune",
        "--load",
        str(tmp_path / "a"),
        "--save",
        str(tmp_path / "b"),
        *data_args(corpus, "gpt"),
        base=TINY_TOKENIZER_VOCAB,
        check=False,
    )
    refused(proc, f"--load {tmp_path / 'a'}", "names no tokenizer", "--tokenizer-model")


def test_a_checkpoint_without_a_carried_copy_reads_the_recorded_path(tmp_path):
    """Checkpoints saved before the copy existed name their tokenizer by path, as before."""
    record = {"type": "HuggingFaceTokenizer", "model": str(SMOLLM2)}
    assert checkpoint_tokenizer_files(record, tmp_path, "--load X") == (str(SMOLLM2), None)
    gone = {**record, "model": str(tmp_path / "gone")}
    with pytest.raises(ValueError, match="gone recorded in the checkpoint is missing; pass --tokenizer-model"):
        checkpoint_tokenizer_files(gone, tmp_path, "--load X")
    none = {"type": "HuggingFaceTokenizer", "model": None}
    assert checkpoint_tokenizer_files(none, tmp_path, "--load X") == (None, None)
