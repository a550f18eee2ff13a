"""``--code-matrix FILE``: a user-given GF(2) recoding matrix is read in three formats, validated
(one-line errors naming the file, exit 2), enters the fingerprint, and survives train → HF export
(logits parity) → evaluation exactly."""

import json

import numpy as np
import pytest
import torch

from megatron_fixedcode.codes import CodeSpec, gf2_rank, sample_recoding_matrix
from megatron_fixedcode.models.code_matrix_file import load_code_matrix
from megatron_fixedcode.pretrain import main
from tests.helpers.pretrain import TINY, data_args, pretrain, write_corpus


def circulant(k: int, shifts: tuple[int, ...]) -> np.ndarray:
    a = np.zeros((k, k), dtype=np.uint8)
    for i in range(k):
        for d in shifts:
            a[i, (i + d) % k] = 1
    return a


HAND_MADE_10 = circulant(10, (0, 1, 2, 4, 6))  # K = 10 (V = 1024), weight 5 everywhere, invertible
LIGHT_10 = circulant(10, (0, 1, 3))  # invertible, weight 3 < paper 2's 4


def test_hand_made_matrices_are_what_the_tests_assume():
    assert gf2_rank(HAND_MADE_10) == 10 and gf2_rank(LIGHT_10) == 10
    assert HAND_MADE_10.sum(axis=0).tolist() == [5] * 10 and LIGHT_10.sum(axis=1).tolist() == [3] * 10


def test_npy_json_and_text_give_the_same_matrix_and_offsets(tmp_path):
    np.save(tmp_path / "a.npy", HAND_MADE_10)
    (tmp_path / "a.json").write_text(json.dumps({"matrix": HAND_MADE_10.tolist(), "offset": [1, 0, 1] + [0] * 7}))
    rows = [" ".join(map(str, r)) if i % 2 else "".join(map(str, r)) for i, r in enumerate(HAND_MADE_10)]
    (tmp_path / "a.txt").write_text("# released matrix\n" + "\n".join(rows) + "\noffset: 0x5  # b\n")
    loaded = [load_code_matrix(tmp_path / f"a.{ext}") for ext in ("npy", "json", "txt")]
    assert all(np.array_equal(np.asarray(m.matrix), HAND_MADE_10) for m in loaded)
    assert [m.offset for m in loaded] == [None, 5, 5]
    assert loaded[0].report()[0].endswith("column weights [5, 5, 5, 5, 5, 5, 5, 5, 5, 5] (min 5)")
    assert len(loaded[0].report()) == 1  # no warning at weight >= 4


def test_light_matrix_is_accepted_with_a_weight_warning(tmp_path):
    (tmp_path / "light.json").write_text(json.dumps(LIGHT_10.tolist()))
    report = load_code_matrix(tmp_path / "light.json").report()
    assert "row weights [3, 3, 3, 3, 3, 3, 3, 3, 3, 3] (min 3)" in report[0]
    assert report[1].startswith(f"warning: --code-matrix {tmp_path / 'light.json'}: a row or column weight is below 4")


def test_fingerprint_hashes_the_matrix_not_where_it_came_from():
    seed_spec = CodeSpec.create(kind="gf2", vocab_size=49152, hidden_size=2048, seed=12345)
    same = CodeSpec.create(kind="gf2", vocab_size=49152, hidden_size=2048, matrix=sample_recoding_matrix(16, 12345))
    other = CodeSpec.create(kind="gf2", vocab_size=49152, hidden_size=2048, matrix=circulant(16, (0, 1, 2, 3, 5)))
    assert same.fingerprint == seed_spec.fingerprint == "977ba5f1ef736b2b" and same.seed is None
    assert other.fingerprint != seed_spec.fingerprint and other.min_weight == 5


def _write(tmp_path, name: str, content) -> str:
    path = tmp_path / name
    if name.endswith(".npy"):
        np.save(path, content)
    else:
        path.write_text(content)
    return str(path)


BAD = {  # file name -> (content, words of the error)
    "rect.txt": ("0110\n1011\n", "must be square"),
    "ragged.json": (json.dumps([[1, 0], [1]]), "must be square"),
    "two.json": (json.dumps([[1, 2], [0, 1]]), "entries must be 0 or 1"),
    "singular.npy": (np.ones((10, 10), dtype=np.uint8), "singular over GF(2): rank 1 < 10"),
    "k8.npy": (np.eye(8, dtype=np.uint8), "code_matrix must be 10x10, got shape (8, 8)"),
    "offset.json": (json.dumps({"matrix": np.eye(10, dtype=int).tolist(), "offset": 4096}), "not a 10-bit mask"),
    "missing.txt": (None, "no such file"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_matrix_files_are_one_line_errors_naming_the_file(tmp_path, capsys, name):
    content, words = BAD[name]
    path = str(tmp_path / name) if content is None else _write(tmp_path, name, content)
    with pytest.raises(SystemExit) as exit_info:
        main([*TINY, "--train-iters", "1", "--input-embedding", "gf2", "--code-matrix", path, "--dry-run"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and f"--code-matrix {path}: " in errors[0] and words in errors[0], err
    assert "Traceback" not in err


def test_code_matrix_needs_gf2_and_agrees_with_code_offset(tmp_path, capsys):
    path = _write(tmp_path, "a.json", json.dumps({"matrix": HAND_MADE_10.tolist(), "offset": 3}))
    for extra, words in (
        (["--input-embedding", "binary"], "needs --input-embedding gf2"),
        (["--input-embedding", "gf2", "--code-offset", "1"], "gives offset 3, --code-offset 1"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main([*TINY, "--train-iters", "1", *extra, "--code-matrix", path, "--dry-run"])
        assert exit_info.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.slow
def test_trained_with_a_hand_made_matrix_exports_and_evaluates_exactly_that_map(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    from megatron_fixedcode.checkpoint import load_megatron_checkpoint, megatron_logits
    from megatron_fixedcode.eval.run import checkpoint_perplexity
    from megatron_fixedcode.export import convert_checkpoint_to_hf
    from megatron_fixedcode.export.llama import model_config_from_llama
    from tests.helpers.export import hf_logits

    corpus = write_corpus(tmp_path)
    matrix_file = _write(tmp_path, "released.json", json.dumps({"matrix": HAND_MADE_10.tolist(), "offset": 6}))
    save = str(tmp_path / "ckpt")
    run = pretrain(
        "--input-embedding",
        "gf2",
        "--code-matrix",
        matrix_file,
        "--code-kernel",
        "torch",
        "--train-iters",
        "2",
        "--save",
        save,
        *data_args(corpus, "gpt"),
    )
    assert f"--code-matrix {matrix_file}: 10x10, full rank over GF(2)" in run.stderr

    ckpt = load_megatron_checkpoint(save)
    code = ckpt.model_cfg.code_spec()
    assert np.array_equal(code.matrix_array, HAND_MADE_10) and code.offset_mask() == 6 and code.seed is None
    seeded = CodeSpec.create(kind="gf2", vocab_size=1024, hidden_size=64, seed=12345, offset=6)
    assert ckpt.trainer_state["identity"]["code_fingerprint"] == code.fingerprint != seeded.fingerprint

    vocab = ckpt.model_cfg.vocab_size
    ids = torch.randint(0, vocab, (2, 24), generator=torch.Generator().manual_seed(0))
    hf_dir = convert_checkpoint_to_hf(save, tmp_path / "hf")
    ref = megatron_logits(ckpt.model, ids, vocab)
    assert (hf_logits(hf_dir, ids) - ref).abs().max().item() < 1e-4
    config = json.loads((hf_dir / "config.json").read_text())
    assert (
        config["fixed_code"]["fingerprint"] == code.fingerprint
        and config["fixed_code"]["matrix"] == HAND_MADE_10.tolist()
    )
    assert model_config_from_llama(config).code_spec().fingerprint == code.fingerprint  # HF import rebuilds it
    free_dir = convert_checkpoint_to_hf(save, tmp_path / "hf_free", table_free=True)
    assert torch.equal(hf_logits(free_dir, ids, trust_remote_code=True), hf_logits(hf_dir, ids))

    result = checkpoint_perplexity(save, data_path=[corpus[1]])
    assert result["code_fingerprint"] == code.fingerprint and result["tokens"] > 0

    refused = pretrain(
        "--input-embedding",
        "gf2",
        "--code-kernel",
        "torch",
        "--train-iters",
        "4",
        "--load",
        save,
        "--save",
        save,
        *data_args(corpus, "gpt"),
        check=False,
    )  # resuming with the seed's matrix instead
    assert refused.returncode == 2 and f"(code {code.fingerprint})" in refused.stderr
