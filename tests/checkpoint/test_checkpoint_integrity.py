"""Nothing lost, nothing silently wrong: checkpoint checksums verified on every load,
a way forward from a corrupt latest checkpoint, resume identity (tokenizer, shapes, resolved data
paths, LR schedule), fresh-start vs missing --load, parse-time validation, non-finite stop."""

import json
import os
import shutil
from pathlib import Path

import pytest

from megatron_fixedcode import checkpoint
from megatron_fixedcode.checkpoint import latest_step
from tests.helpers import REPO
from tests.helpers.errors import logged_errors, refused
from tests.helpers.pretrain import data_args, pretrain, write_corpus

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def _tokenizer(root: Path, shift: int) -> str:
    """A 1024-word WordLevel tokenizer; ``shift`` permutes the words (same size, another tokenizer)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<|endoftext|>": 0, **{f"w{(i + shift) % 1023}": i + 1 for i in range(1023)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    root.mkdir(parents=True)
    tok.save(str(root / "tokenizer.json"))
    return str(root)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus):
    """One short run with --load X --save X and nothing in X yet: saves steps 1 and 2."""
    root = tmp_path_factory.mktemp("trained")
    tok = _tokenizer(root / "tok_a", 0)
    ckpt = str(root / "ckpt")
    proc = pretrain(
        "--train-iters",
        "2",
        "--save-interval",
        "1",
        "--load",
        ckpt,
        "--save",
        ckpt,
        "--tokenizer-model",
        tok,
        *data_args(corpus, "document_windows"),
    )
    return {"ckpt": ckpt, "tok": tok, "root": root, "log": proc.stdout + proc.stderr}


def _common(corpus, *extra):
    return [*data_args(corpus, "document_windows"), *extra]


# --- --load X --save X starts fresh with one log line; a --load holding nothing is an error


def test_load_equal_to_save_with_nothing_there_starts_fresh_and_says_so(trained):
    assert trained["log"].count("starting fresh") == 1, trained["log"][-3000:]
    assert latest_step(trained["ckpt"]) == 2


def test_load_that_holds_no_checkpoint_is_an_error(tmp_path, corpus):
    proc = pretrain(
        "--train-iters",
        "2",
        "--load",
        str(tmp_path / "nowhere"),
        "--save",
        str(tmp_path / "out"),
        *_common(corpus),
        check=False,
    )
    refused(proc, "--load", "nowhere", "does not exist")
    assert not (tmp_path / "out").exists()


# --- checksums recorded at save, verified on every load; the way forward


def test_checksums_cover_every_file_of_a_checkpoint(trained):
    target = checkpoint.checkpoint_dir(trained["ckpt"], 2)
    manifest = json.loads((target / checkpoint.CHECKSUMS).read_text())["files"]
    on_disk = {str(p.relative_to(target)) for p in target.rglob("*") if p.is_file() and p.name != checkpoint.CHECKSUMS}
    assert set(manifest) == on_disk and any(n.endswith(".distcp") for n in manifest)


@pytest.fixture
def corrupt(trained, tmp_path):
    """A copy of the trained checkpoint with bytes flipped inside the latest step's .distcp shard."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(trained["ckpt"], ckpt)
    shard = sorted(checkpoint.checkpoint_dir(ckpt, 2).glob("*.distcp"))[0]
    data = bytearray(shard.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 8):
        data[i] ^= 0xFF
    shard.write_bytes(bytes(data))
    return ckpt, shard


def test_corrupt_latest_checkpoint_is_passed_over_at_a_resume_and_refused_where_named(corrupt, trained, corpus):
    """A resume the user did not pin takes the newest checkpoint that verifies in full: step 2's changed bytes (found
    when the ranks hash their shares) are passed over with a warning naming the file, and kept on disk; step 1 loads.
    Named (--ckpt-step 2), or evaluated (--skip-train: what is evaluated is the newest), it is refused in one line
    naming the file and the way forward."""
    ckpt, shard = corrupt
    evaluation = ["--train-iters", "2", "--skip-train"]
    for extra in (evaluation, ["--train-iters", "3", "--save", str(ckpt), "--ckpt-step", "2"]):
        proc = pretrain(*extra, "--load", str(ckpt), "--tokenizer-model", trained["tok"], *_common(corpus), check=False)
        refused(proc, str(shard), "--ckpt-step 1", str(checkpoint.checkpoint_dir(ckpt, 1)))
    assert checkpoint.verified_step(ckpt, 1) == 1  # the way forward verifies
    resumed = ckpt.parent / "resumed"
    shutil.copytree(ckpt, resumed)
    proc = pretrain(
        "--train-iters",
        "3",
        "--load",
        str(resumed),
        "--save",
        str(resumed),
        "--tokenizer-model",
        trained["tok"],
        *_common(corpus),
    )
    out = proc.stdout + proc.stderr
    damaged = checkpoint.checkpoint_dir(resumed, 2)
    assert "checkpoint passed over (kept on disk for inspection)" in out and f"{damaged}/{shard.name}" in out, out[
        -3000:
    ]
    assert f"resumed from {checkpoint.checkpoint_dir(resumed, 1)} (step 1)" in out, out[-3000:]
    (kept,) = resumed.glob("passed_over-iter_0000002-*")  # kept as found, out of the way of step 2's new save
    assert latest_step(resumed) == 3 and (kept / shard.name).read_bytes() == shard.read_bytes()


def test_corrupt_checkpoint_is_refused_by_converter_and_evaluate(corrupt, tmp_path, capsys):
    ckpt, shard = corrupt
    from megatron_fixedcode.checkpoint.single_process import load_megatron_checkpoint

    with pytest.raises(checkpoint.CorruptCheckpoint, match=shard.name):
        load_megatron_checkpoint(ckpt)
    import importlib.util

    def tool(name):
        spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    assert tool("convert_checkpoint_to_hf").main(["--load", str(ckpt), "--output", str(tmp_path / "hf")]) == 2
    text = tmp_path / "doc.txt"
    text.write_text("w1 w2 w3 " * 50)
    assert tool("evaluate").main(["--load", str(ckpt), "--text-files", str(text)]) == 2
    err = capsys.readouterr().err
    assert err.count(str(shard)) == 2 and "--ckpt-step 1" in err
    assert not (tmp_path / "hf").exists()


def _copy(trained, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(trained["ckpt"], ckpt)
    return ckpt, checkpoint.checkpoint_dir(ckpt, 2)


def test_a_checkpoint_that_claims_checksums_and_lost_them_is_refused(trained, corpus, tmp_path):
    """Deleting checksums.json no longer loads changed bytes under the false
    reason 'saved before checksums were recorded' — the checkpoint's metadata says it had them."""
    from megatron_fixedcode.checkpoint.single_process import load_megatron_checkpoint

    ckpt, target = _copy(trained, tmp_path)
    (target / checkpoint.CHECKSUMS).unlink()
    with pytest.raises(checkpoint.CorruptCheckpoint, match="saved with checksums.*--no-verify-checkpoint"):
        load_megatron_checkpoint(ckpt)
    proc = pretrain(
        "--train-iters",
        "2",
        "--skip-train",
        "--load",
        str(ckpt),
        "--tokenizer-model",
        trained["tok"],
        *_common(corpus),
        check=False,
    )
    refused(proc, str(target / checkpoint.CHECKSUMS), "--ckpt-step 1")
    # the explicit way past it, with a warning
    proc = pretrain(
        "--train-iters",
        "2",
        "--skip-train",
        "--load",
        str(ckpt),
        "--no-verify-checkpoint",
        "--tokenizer-model",
        trained["tok"],
        *_common(corpus),
    )
    assert "--no-verify-checkpoint: loading" in proc.stdout + proc.stderr
    assert load_megatron_checkpoint(ckpt, verify=False).step == 2


def test_a_file_missing_from_the_checksums_is_refused(trained, tmp_path):
    ckpt, target = _copy(trained, tmp_path)
    record_path = target / checkpoint.CHECKSUMS
    record = json.loads(record_path.read_text())
    dropped = sorted(n for n in record["files"] if n.endswith(".distcp"))[0]
    del record["files"][dropped]
    record_path.write_text(json.dumps(record))
    with pytest.raises(checkpoint.CorruptCheckpoint, match=f"{dropped}: not covered by {checkpoint.CHECKSUMS}"):
        checkpoint.verified_step(ckpt, 2)
    assert checkpoint.verified_step(ckpt, 2, verify=False) == 2


# --- resume refusals name the field; the tokenizer joins the resume identity


def _resume_refusal(*args: str) -> str:
    """The refusal of a resume, decided before any process group (run_plan.check_resume_compatible is
    pure): in this process, without launching a trainer. One end-to-end case proves the one-line exit 2."""
    from megatron_fixedcode.arguments.parse import parse_pretrain_args
    from megatron_fixedcode.training.run_plan import plan_run
    from tests.helpers.pretrain import TINY

    with pytest.raises(ValueError) as e:
        plan_run(parse_pretrain_args([*TINY, *args]), check_machine=False)
    return str(e.value)


def test_resume_refusal_is_one_line_and_exit_2(trained, corpus):
    proc = pretrain(
        "--train-iters",
        "3",
        "--load",
        trained["ckpt"],
        "--tokenizer-model",
        trained["tok"],
        "--hidden-size",
        "128",
        *_common(corpus),
        check=False,
    )
    refused(proc, "hidden_size", "128")


@pytest.mark.parametrize(
    "flag,value,field", [("--hidden-size", "128", "hidden_size"), ("--vocab-size", "2048", "vocab_size")]
)
def test_resume_refusal_names_the_field_that_differs(trained, corpus, flag, value, field):
    message = _resume_refusal(
        "--train-iters",
        "3",
        "--load",
        trained["ckpt"],
        "--tokenizer-model",
        trained["tok"],
        flag,
        value,
        *_common(corpus),
    )
    assert field in message and value in message, message


def test_resume_with_another_tokenizer_of_the_same_size_is_refused(trained, corpus, tmp_path):
    other = _tokenizer(tmp_path / "tok_b", 7)
    message = _resume_refusal(
        "--train-iters", "3", "--load", trained["ckpt"], "--tokenizer-model", other, *_common(corpus)
    )
    assert "tokenizer" in message and other in message and "--finetune" in message, message


# --- LR schedule on resume; data paths compared resolved


def test_changed_lr_on_resume_is_refused_naming_the_flag(trained, corpus):
    message = _resume_refusal(
        "--train-iters",
        "2",
        "--lr",
        "6e-3",
        "--load",
        trained["ckpt"],
        "--tokenizer-model",
        trained["tok"],
        *_common(corpus),
    )
    for needle in ("--lr", "0.003", "0.006", "--override-opt-param-scheduler", "--use-checkpoint-opt-param-scheduler"):
        assert needle in message, message


def test_override_schedule_and_relative_data_path_resume(trained, corpus, tmp_path):
    """The same data by a relative path resumes; --override-opt-param-scheduler puts the new --lr
    (and the longer run's decay) in force, and the start-up log says so."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(trained["ckpt"], ckpt)
    train, valid = (os.path.relpath(p, REPO) for p in corpus)
    assert not os.path.isabs(train)
    proc = pretrain(
        "--train-iters",
        "3",
        "--lr",
        "6e-3",
        "--override-opt-param-scheduler",
        "--load",
        str(ckpt),
        "--save",
        str(ckpt),
        "--tokenizer-model",
        trained["tok"],
        "--train-data-path",
        train,
        "--dataset-type",
        "document_windows",
        "--valid-data-path",
        valid,
        "--samples-per-shard-visit",
        "16",
        "--metrics-file",
        str(tmp_path / "m.jsonl"),
    )
    log = proc.stdout + proc.stderr
    assert "LR schedule in force (from command line (--override-opt-param-scheduler)): lr 0.006" in log, log[-3000:]
    assert "decay over 3 steps" in log
    assert [json.loads(ln)["step"] for ln in (tmp_path / "m.jsonl").read_text().splitlines()] == [3]
    assert latest_step(ckpt) == 3


# --- a non-finite loss stops training before it is saved


def test_non_finite_loss_stops_before_any_save(tmp_path, corpus):
    ckpt = tmp_path / "ckpt"
    proc = pretrain(
        "--train-iters",
        "6",
        "--save",
        str(ckpt),
        "--save-interval",
        "1",
        "--lr",
        "1e30",  # validate_results:
        "--lr-warmup-iters",
        "0",
        "--clip-grad",
        "0",
        "--vocab-size",
        "1024",  # tests/recovery/test_rerun.py
        "--rerun-mode",
        "disabled",
        *_common(corpus),
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out[-3000:]
    line = logged_errors(out)[0]
    failed_step = int(line.split("step ")[1].split(":")[0])
    assert "--no-check-for-nan-in-loss-and-grad" in line
    assert (latest_step(ckpt) or 0) < failed_step, (latest_step(ckpt), failed_step)


# --- parse-time validation


def test_parse_time_validation(capsys):
    from megatron_fixedcode.arguments.parse import parse_pretrain_args
    from tests.helpers.pretrain import TINY

    with pytest.raises(SystemExit) as e:
        parse_pretrain_args([*TINY, "--train-iters", "2", "--data-path", "x", "--global-batch-size", "0"])
    assert e.value.code == 2
    assert "--global-batch-size must be >= 1" in capsys.readouterr().err
    # --eval-iters 0 turns evaluation off, whatever --eval-interval says (Megatron-LM's meaning)
    cfg = parse_pretrain_args(
        [*TINY, "--train-iters", "2", "--data-path", "x", "--eval-iters", "0", "--eval-interval", "2"]
    )
    assert cfg.args.eval_iters == 0


# --- one job at a time writes a --save directory


def test_second_job_on_a_locked_save_directory_is_refused(tmp_path, corpus):
    from megatron_fixedcode.utils.locks import lock_save_dir

    ckpt = tmp_path / "ckpt"
    with lock_save_dir(ckpt):  # stands for a first job still training into it
        proc = pretrain("--train-iters", "1", "--save", str(ckpt), *_common(corpus), check=False)
    refused(proc, f"--save {ckpt}", "in use by another run", f"pid {os.getpid()}")
    assert latest_step(ckpt) is None and not list(ckpt.glob("iter_*"))


# --- a resume that changes only the data-parallel size keeps Adam and RNG state

# DP2 sums each rank's two micro-batch gradients, then all-reduces the two partial sums; DP1
# accumulates the four micro-batches in one sum. The float32 summation order differs, so the runs
# agree to rounding, not bit for bit (measured: <= 2e-7 relative over three steps); a resume that
# dropped Adam's moments differed by 2e-3..4e-3 from the second step after it (measured).
DP_RESHARD_RTOL = 1e-4


def test_resume_on_another_data_parallel_size_keeps_adam_and_rng(tmp_path, corpus):
    """6 steps on 2 ranks (DP2) straight vs. stopped at step 3 and resumed on 1 rank (DP1, the
    same global batch of 8 by 4 accumulated micro-batches instead of 2 per rank)."""
    common = ["--train-iters", "6", "--lr-warmup-iters", "1", *_common(corpus)]
    pretrain(*common, "--metrics-file", str(tmp_path / "straight.jsonl"), nproc=2)
    ckpt = str(tmp_path / "ckpt")
    pretrain(*common, "--save", ckpt, "--exit-interval", "3", nproc=2)
    assert latest_step(ckpt) == 3
    proc = pretrain(*common, "--save", ckpt, "--load", ckpt, "--metrics-file", str(tmp_path / "dp1.jsonl"))
    log = proc.stdout + proc.stderr
    assert "optimizer state and the RNG states of data-parallel rank 0 kept" in log, log[-3000:]
    from tests.helpers.pretrain import read_metrics

    straight = {r["step"]: r for r in read_metrics(tmp_path / "straight.jsonl")}
    resumed = read_metrics(tmp_path / "dp1.jsonl")
    assert [r["step"] for r in resumed] == [4, 5, 6]
    for r in resumed:
        s = straight[r["step"]]
        assert (r["lr"], r["tokens"]) == (s["lr"], s["tokens"]), r["step"]
        # Steps 5 and 6 are the first whose weights Adam's restored moments moved (step 4's loss
        # is computed on the loaded weights).
        assert r["loss"] == pytest.approx(s["loss"], rel=DP_RESHARD_RTOL), (r["step"], r["loss"], s["loss"])
        assert r["grad_norm"] == pytest.approx(s["grad_norm"], rel=DP_RESHARD_RTOL), (
            r["step"],
            r["grad_norm"],
            s["grad_norm"],
        )


def test_finetune_into_a_directory_with_checkpoints_is_refused(trained, corpus, tmp_path):
    """--finetune --load X --save X used to overwrite X's iter_2 and moved latest back."""
    ckpt, target = _copy(trained, tmp_path)
    before = {p.name: p.stat().st_mtime_ns for p in target.iterdir()}
    proc = pretrain(
        "--train-iters",
        "1",
        "--finetune",
        "--load",
        str(ckpt),
        "--save",
        str(ckpt),
        "--tokenizer-model",
        trained["tok"],
        *_common(corpus),
        check=False,
    )
    refused(proc, f"--save {ckpt} holds checkpoints up to step 2", f"--load {ckpt} --save {ckpt}")
    assert latest_step(ckpt) == 2 and {p.name: p.stat().st_mtime_ns for p in target.iterdir()} == before
    # into a new directory it runs
    pretrain(
        "--train-iters",
        "1",
        "--finetune",
        "--load",
        str(ckpt),
        "--save",
        str(tmp_path / "ft"),
        "--tokenizer-model",
        trained["tok"],
        *_common(corpus),
    )
    assert latest_step(tmp_path / "ft") == 1


def test_binary_garbage_in_the_latest_marker_is_passed_over_naming_it(trained, corpus, tmp_path):
    """The marker is read as bytes; non-ASCII is a warning naming the file, and the resume takes the newest
    checkpoint that verifies (step 2); a --ckpt-step resume is not affected by it."""
    ckpt, _ = _copy(trained, tmp_path)
    marker = ckpt / checkpoint.LATEST_MARKER
    marker.write_bytes(b"\xff\xfe\x00\x9c garbage")
    proc = pretrain(
        "--train-iters",
        "3",
        "--load",
        str(ckpt),
        "--save",
        str(ckpt),
        "--tokenizer-model",
        trained["tok"],
        *_common(corpus),
    )
    out = proc.stdout + proc.stderr
    assert f"{marker}: expected an iteration number, found binary data" in out, out[-3000:]
    assert f"resumed from {checkpoint.checkpoint_dir(ckpt, 2)} (step 2)" in out and latest_step(ckpt) == 3


def test_evaluate_refuses_another_tokenizer_and_records_its_own(trained, tmp_path, capsys):
    """tools/evaluate.py --load CKPT --tokenizer-model OTHER gave a loss of the
    wrong thing with rc 0; --tokenizer-model beside --hf-model was silently ignored."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("evaluate", REPO / "tools" / "evaluate.py")
    evaluate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(evaluate)
    text = tmp_path / "doc.txt"
    text.write_text("w1 w2 w3 " * 50)
    other = _tokenizer(tmp_path / "tok_other", 7)  # same vocabulary size, other ids
    assert evaluate.main(["--load", trained["ckpt"], "--text-files", str(text), "--tokenizer-model", other]) == 2
    err = capsys.readouterr().err
    assert f"--tokenizer-model {other}" in err and "is not the tokenizer" in err and trained["tok"] in err
    out = tmp_path / "r.json"
    assert (
        evaluate.main(
            [
                "--load",
                trained["ckpt"],
                "--text-files",
                str(text),
                "--tokenizer-model",
                trained["tok"],
                "--output",
                str(out),
            ]
        )
        == 0
    )
    record = json.loads(out.read_text())["tokenizer"]
    assert record["model"] == trained["tok"] and record["vocab_size"] == 1024 and record["fingerprint"]
    assert evaluate.main(["--hf-model", str(tmp_path), "--text-files", str(text), "--tokenizer-model", other]) == 2
    assert "--tokenizer-model applies to --load" in capsys.readouterr().err


def test_a_failed_final_hugging_face_export_fails_the_run(tmp_path, corpus, monkeypatch):
    """A killed export child left a partial hf/iter_N and the trainer exited 0.
    Here every export child is SIGKILLed with everything written, just before it renames
    iter_N.partial to iter_N (a sitecustomize that only the converter's command line triggers):
    the step-1 export failure is logged and training goes on; the final (step 2) one fails the
    run, exit code 4, one line naming the export and its log. No directory is left under either
    export's name, the killed exports' leftovers are removed, and the checkpoints are complete."""
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(
        "import os, signal, sys\n"
        "if 'megatron_fixedcode.cli.convert_checkpoint_to_hf' in sys.orig_argv:\n"
        "    rename = os.rename\n"
        "    def killed_before_rename(src, dst, *args, **kwargs):\n"
        "        if str(src).endswith('.partial'):\n"
        "            os.kill(os.getpid(), signal.SIGKILL)\n"
        "        return rename(src, dst, *args, **kwargs)\n"
        "    os.rename = killed_before_rename\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(inject), os.environ.get("PYTHONPATH")])))
    ckpt = tmp_path / "ckpt"
    proc = pretrain(
        "--train-iters",
        "2",
        "--save",
        str(ckpt),
        "--save-interval",
        "1",
        "--hf-export-interval",
        "1",
        *_common(corpus),
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    errors = logged_errors(out)
    assert len(errors) == 2, errors
    step1, step2 = (ckpt / "hf" / f"iter_{s:07d}" for s in (1, 2))
    assert "export of step 1 failed (killed by signal 9" in errors[0] and "(training goes on)" in errors[0]
    assert "export of step 2 failed (killed by signal 9" in errors[1] and f"{step2}.log" in errors[1]
    assert f"--load {ckpt} --ckpt-step 2 --output {step2}" in errors[1]
    assert sorted(p.name for p in (ckpt / "hf").iterdir()) == ["iter_0000001.log", "iter_0000002.log"]
    assert latest_step(ckpt) == 2 and checkpoint.verified_step(ckpt, 2) == 2
