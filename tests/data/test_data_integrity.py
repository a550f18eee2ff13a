"""Data integrity: one writer per output (locks), shard/.idx consistency and token-id
checks at start-up, helpers that die with their parent, --save pre-flight checks, and bounded
memory for huge documents. Each test fails on the code before the fix."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from megatron_fixedcode.utils.locks import LockHeld, lock_output_prefix, lock_save_dir
from tests.helpers.errors import refused

REPO = Path(__file__).resolve().parents[2]


def _python(code: str, **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        cwd=str(REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"helper exited early: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for {path}")
        time.sleep(0.05)


# --------------------------------------------------------------------------- 1: locks


def test_lock_refuses_second_holder_and_names_it(tmp_path):
    first = lock_output_prefix(tmp_path / "out")
    with pytest.raises(LockHeld, match=rf"--output-prefix .*out is in use by another run: pid {os.getpid()} on host"):
        lock_output_prefix(tmp_path / "out")
    first.release()
    assert not (tmp_path / "out.lock").exists()  # no debris after a clean release
    lock_output_prefix(tmp_path / "out").release()


def test_lock_of_killed_holder_is_taken_over(tmp_path):
    ready = tmp_path / "ready"
    holder = _python(f"""
        import time
        from megatron_fixedcode.utils.locks import lock_save_dir
        lock = lock_save_dir({str(tmp_path / "ckpt")!r})
        open({str(ready)!r}, 'w').close()
        time.sleep(600)
    """)
    _wait_for(ready, holder)
    with pytest.raises(LockHeld, match=rf"--save .*ckpt is in use by another run: pid {holder.pid} "):
        lock_save_dir(tmp_path / "ckpt")
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    lock = lock_save_dir(tmp_path / "ckpt")  # the kernel released the dead holder's flock
    assert lock.took_over["pid"] == holder.pid
    lock.release()


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory) -> str:
    from megatron_fixedcode.tokenizers import train_bpe_tokenizer

    out = tmp_path_factory.mktemp("bpe")
    (out / "train.txt").write_text(" ".join(f"doc t{i} word{i % 13}." for i in range(300)), encoding="utf-8")
    return str(train_bpe_tokenizer([str(out / "train.txt")], 300, str(out / "tok")))


def _corpus(path: Path, n: int = 400) -> Path:
    path.write_text(
        "".join(json.dumps({"id": str(i), "text": f"doc t{i} word{i % 13}. " * (1 + i % 7)}) + "\n" for i in range(n))
    )
    return path


_PAUSED_PREPROCESS = """
    import sys, time
    from pathlib import Path
    import megatron_fixedcode.data.preprocess.pipeline as pl
    orig = pl.iter_chunks
    def paused(files, cfg):
        for i, chunk in enumerate(orig(files, cfg)):
            if i == 1:  # holds the lock and has written part of its outputs
                Path({ready!r}).touch()
                while not Path({go!r}).exists():
                    time.sleep(0.05)
            yield chunk
    pl.iter_chunks = paused
    sys.path.insert(0, "tools")
    import preprocess_data
    sys.exit(preprocess_data.main({argv!r}))
"""


def _preprocess_argv(corpus: Path, prefix: Path, tokenizer: str) -> list[str]:
    return [
        "--input",
        str(corpus),
        "--output-prefix",
        str(prefix),
        "--tokenizer-type",
        "HuggingFaceTokenizer",
        "--tokenizer-model",
        tokenizer,
        "--append-eod",
        "--id-key",
        "id",
        "--valid-fraction",
        "0.1",
        "--chunk-docs",
        "50",
    ]


def test_concurrent_preprocess_on_one_prefix_second_refused_first_complete(tmp_path, small_tokenizer):
    """The second writer exits 2 at once naming the holder; the first's outputs
    are complete and load."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    corpus, prefix = _corpus(tmp_path / "c.jsonl"), tmp_path / "out" / "books"
    ready, go = tmp_path / "ready", tmp_path / "go"
    argv = _preprocess_argv(corpus, prefix, small_tokenizer)
    first = _python(_PAUSED_PREPROCESS.format(ready=str(ready), go=str(go), argv=argv))
    _wait_for(ready, first)
    second = subprocess.run(
        [sys.executable, "tools/preprocess_data.py", *argv], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    go.touch()
    out, err = first.communicate(timeout=300)
    assert second.returncode == 2, second.stderr
    last = second.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --output-prefix") and f"pid {first.pid} " in last, second.stderr
    assert "Traceback" not in second.stderr
    assert first.returncode == 0, err
    summary = json.loads(Path(f"{prefix}_summary.json").read_text())
    for split in ("train", "valid"):
        ds = IndexedDataset(f"{prefix}_{split}_text_document")
        assert len(ds.document_indices) - 1 == summary["documents"][split]
        assert int(ds.sequence_lengths.sum()) == summary["tokens"][split]
    assert summary["documents"]["train"] + summary["documents"]["valid"] == 400
    assert not Path(f"{prefix}.lock").exists()


def test_preprocess_takes_over_lock_of_killed_run(tmp_path, small_tokenizer):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    corpus, prefix = _corpus(tmp_path / "c.jsonl"), tmp_path / "books"
    ready = tmp_path / "ready"
    argv = _preprocess_argv(corpus, prefix, small_tokenizer)
    killed = _python(
        _PAUSED_PREPROCESS.format(ready=str(ready), go=str(tmp_path / "never"), argv=argv + ["--workers", "2"])
    )
    _wait_for(ready, killed)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert Path(f"{prefix}.lock").exists()  # left behind by the killed run
    rerun = subprocess.run(
        [sys.executable, "tools/preprocess_data.py", *argv], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert rerun.returncode == 0, rerun.stderr  # its pool workers died with it: lock free
    assert "taking over the lock" in rerun.stderr
    assert len(IndexedDataset(f"{prefix}_train_text_document").document_indices) > 1


def test_merge_output_locked(tmp_path):
    from megatron_fixedcode.data.preprocess import merge_datasets
    from tests.helpers.data import write_indexed_dataset

    a = write_indexed_dataset(tmp_path / "a", [np.arange(1, 5)])
    with lock_output_prefix(tmp_path / "m"):
        with pytest.raises(LockHeld, match="is in use by another run"):
            merge_datasets([a], str(tmp_path / "m"))
    assert merge_datasets([a], str(tmp_path / "m"))["documents"] == 1


# --------------------------------------------------------------------------- 6: shard checks


def _build(tmp_path, prefixes, dataset_type, vocab_size, seq=8, valid=None):
    from megatron_fixedcode.data import DataConfig, build_datasets
    from tests.helpers.data import StubTokenizer, single_process_group

    cfg = DataConfig(
        data_path=prefixes,
        valid_data_path=valid,
        dataset_type=dataset_type,
        seq_length=seq,
        split="100,0,0",
        cache_path=str(tmp_path / "cache"),
    )
    with single_process_group(tmp_path):
        return build_datasets(
            cfg, StubTokenizer(vocab_size=vocab_size), num_train_samples=16, num_valid_samples=0, seed=3
        )


@pytest.mark.parametrize("dataset_type", ["gpt", "document_windows"])
@pytest.mark.parametrize("damage", ["bin_short", "bin_long", "idx_truncated", "idx_header"])
def test_damaged_shard_refused_at_startup_naming_it(tmp_path, dataset_type, damage):
    """A .bin 2 bytes short (and other index/data mismatches) is refused when
    the datasets are built, naming the shard, not when the sampler reaches the damage."""
    from tests.helpers.data import random_documents, write_indexed_dataset

    rng = np.random.default_rng(0)
    good = write_indexed_dataset(tmp_path / "good", random_documents(rng, [40] * 5, 500))
    bad = write_indexed_dataset(tmp_path / "bad", random_documents(rng, [40] * 5, 500))
    if damage == "bin_short":
        os.truncate(bad + ".bin", os.path.getsize(bad + ".bin") - 2)
    elif damage == "bin_long":
        with open(bad + ".bin", "ab") as f:
            f.write(b"\0" * 4)
    elif damage == "idx_truncated":
        os.truncate(bad + ".idx", os.path.getsize(bad + ".idx") - 8)
    else:
        with open(bad + ".idx", "r+b") as f:
            f.write(b"XXXX")
    with pytest.raises(ValueError, match=rf"^data_path {bad}: .*{'bad.bin' if 'bin' in damage else 'bad.idx'}"):
        _build(tmp_path, [good, bad], dataset_type, vocab_size=500)
    _build(tmp_path, [good], dataset_type, vocab_size=500)  # the intact shard alone is fine


def test_valid_shard_checked_too(tmp_path):
    from tests.helpers.data import random_documents, write_indexed_dataset

    rng = np.random.default_rng(0)
    good = write_indexed_dataset(tmp_path / "good", random_documents(rng, [40] * 5, 500))
    bad = write_indexed_dataset(tmp_path / "v", random_documents(rng, [40] * 5, 500))
    os.truncate(bad + ".bin", 10)
    with pytest.raises(ValueError, match=rf"^valid_data_path {bad}: .*truncated"):
        _build(tmp_path, [good], "document_windows", vocab_size=500, valid=[bad])


def test_token_dtype_must_hold_the_vocabulary(tmp_path):
    from tests.helpers.data import random_documents, write_indexed_dataset

    shard = write_indexed_dataset(
        tmp_path / "u16", random_documents(np.random.default_rng(0), [40] * 3, 500), dtype=np.uint16
    )
    with pytest.raises(ValueError, match=rf"^data_path {shard}: tokens are stored as uint16 .* 70000 ids"):
        _build(tmp_path, [shard], "document_windows", vocab_size=70000)


@pytest.mark.parametrize("dataset_type", ["gpt", "document_windows"])
def test_token_id_beyond_vocabulary_is_a_named_error(tmp_path, dataset_type):
    """Ids >= V gave a bare IndexError in the learned embedding; every input interface now gets
    the same named check when the sample is read (it names shard and document)."""
    from megatron_fixedcode.data.validate import TokenIdOutOfRange
    from tests.helpers.data import write_indexed_dataset

    docs = [np.full(40, 7)] + [np.r_[np.full(20, 7), np.full(20, 900)]] * 3
    shard = write_indexed_dataset(tmp_path / "ids", docs)
    train, _ = _build(tmp_path, [shard], dataset_type, vocab_size=500)
    with pytest.raises(
        TokenIdOutOfRange, match=rf"^{shard} \(document.* token id 900 is outside the vocabulary \[0, 500\)"
    ):
        for i in range(len(train)):
            train[i]


def _trainer_refused_on_two_ranks(proc, *needles) -> str:
    """A data error under torchrun: exactly one error line (rank 0's) naming ``needles``, every
    rank exits 2 (torchrun's own failure report says so; torchrun itself exits 1), and no rank
    prints a traceback (torchrun's own report is the only one)."""
    import re

    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    errors = [
        line for line in out.splitlines() if line.startswith("ERROR:") or "pretrain: error: " in line
    ]  # logged / at parse time
    assert len(errors) == 1, (errors, out[-3000:])
    for needle in needles:
        assert needle in errors[0], errors[0]
    codes = re.findall(r"exitcode\s*:\s*(-?\d+)", out)
    assert codes and set(codes) <= {"2", "-15"} and "2" in codes, (codes, out[-3000:])  # -15: torchrun ended it first
    frames = [
        line
        for line in out.splitlines()
        if line.lstrip().startswith('File "') and "torch/distributed" not in line and "<frozen runpy>" not in line
    ]
    assert not frames, frames
    return errors[0]


@pytest.mark.slow
def test_damaged_shard_stops_two_rank_training_with_one_line(tmp_path):
    """A .bin 2 bytes short, found by the index check at parse time (before the process group
    exists; the dataset build repeats it): one line on rank 0 naming the shard, exit code 2, no
    traceback per rank."""
    from tests.helpers.pretrain import data_args, pretrain, write_corpus

    train, valid = write_corpus(tmp_path)
    os.truncate(train + ".bin", os.path.getsize(train + ".bin") - 2)
    proc = pretrain("--train-iters", "2", *data_args((train, valid), "document_windows"), nproc=2, check=False)
    _trainer_refused_on_two_ranks(proc, f"data_path {train}:", "truncated")


@pytest.mark.slow
def test_token_id_beyond_vocabulary_stops_two_rank_training_with_one_line(tmp_path):
    """One document holds an id >= V: whichever rank reads it, every rank stops at that step
    (they agree before the forward pass) and rank 0 names shard and document; exit code 2."""
    from tests.helpers.data import write_indexed_dataset
    from tests.helpers.pretrain import data_args, pretrain

    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 100, size=60) for _ in range(12)]
    docs[5][30] = 2000  # TINY has --vocab-size 1024
    train = write_indexed_dataset(tmp_path / "train", docs, dtype=np.uint16)
    valid = write_indexed_dataset(tmp_path / "valid", docs[:4], dtype=np.uint16)
    proc = pretrain("--train-iters", "8", *data_args((train, valid), "document_windows"), nproc=2, check=False)
    _trainer_refused_on_two_ranks(proc, f"{train} (document 5", "token id 2000 is outside the vocabulary [0, 1024)")


# --------------------------------------------------------------------------- 12: helpers die with parent


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def _helper_after_parent_sigkill(tmp_path, make_queue: str) -> bool:
    """Start a manager-backed queue as megatron's async checkpoint writer does, SIGKILL the
    parent, and report whether the manager process is still alive after a few seconds."""
    pid_file = tmp_path / "helper.pid"
    pid_file.unlink(missing_ok=True)
    parent = _python(f"""
        import time, pathlib
        {make_queue}
        tmp = pathlib.Path({str(pid_file)!r} + ".tmp")
        tmp.write_text(str(queue._manager._process.pid))
        tmp.rename({str(pid_file)!r})  # whole or absent: the test reads it as soon as it exists
        time.sleep(600)
    """)
    _wait_for(pid_file, parent)
    helper = int(pid_file.read_text())
    assert _alive(helper)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(helper) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = _alive(helper)
    if alive:
        os.kill(helper, signal.SIGKILL)
    return alive


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_checkpoint_writer_helper_dies_with_sigkilled_parent(tmp_path):
    """The forked Manager that serves megatron's async-writer results queue
    outlived a SIGKILLed rank; started through compat.process it dies with its parent."""
    assert _helper_after_parent_sigkill(
        tmp_path, "import torch; queue = torch.multiprocessing.get_context('fork').Manager().Queue()"
    )
    assert not _helper_after_parent_sigkill(
        tmp_path, "from megatron_fixedcode.compat.process import helper_queue; queue = helper_queue()"
    )
    # install_die_with_parent_for_forks covers every later fork, megatron's own included
    assert not _helper_after_parent_sigkill(
        tmp_path,
        textwrap.dedent("""
        from megatron_fixedcode.compat.process import install_die_with_parent_for_forks
        import torch
        install_die_with_parent_for_forks()
        queue = torch.multiprocessing.get_context('fork').Manager().Queue()
    """).replace("\n", "\n        "),
    )


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_trainer_checkpoint_results_queue_dies_with_parent(tmp_path):
    """The trainer's own path (checkpoint/save.py's _fork_results_queue)."""
    assert not _helper_after_parent_sigkill(
        tmp_path,
        textwrap.dedent("""
        from megatron_fixedcode.checkpoint.save import _fork_results_queue
        from megatron.core.dist_checkpointing.strategies import filesystem_async
        _fork_results_queue()
        queue = filesystem_async._results_queue
    """).replace("\n", "\n        "),
    )


# --------------------------------------------------------------------------- 7: --save pre-flight


def test_save_under_a_file_refused_before_training(tmp_path):
    from megatron_fixedcode.checkpoint.save_checks import check_save_dir_writable

    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"^--save .*file/ckpt: cannot create the directory: not a directory"):
        check_save_dir_writable(tmp_path / "file" / "ckpt")
    with pytest.raises(ValueError, match=r"^--save .*file: exists and is not a directory"):
        check_save_dir_writable(tmp_path / "file")
    assert check_save_dir_writable(tmp_path / "a" / "b").is_dir()
    assert list((tmp_path / "a" / "b").iterdir()) == []  # the probe is removed


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_save_read_only_refused(tmp_path):
    from megatron_fixedcode.checkpoint.save_checks import check_save_dir_writable

    (tmp_path / "ro").mkdir()
    (tmp_path / "ro").chmod(0o500)
    with pytest.raises(ValueError, match=r"not writable: permission denied"):
        check_save_dir_writable(tmp_path / "ro")


def test_free_space_below_two_checkpoints_warns(tmp_path, monkeypatch):
    import shutil as _shutil

    from megatron_fixedcode.checkpoint import save_checks

    size = save_checks.estimate_checkpoint_bytes(10_000_000)  # 10M params, Adam: ~126 MB
    assert 120e6 < size < 140e6
    usage = _shutil.disk_usage(tmp_path)
    monkeypatch.setattr(save_checks.shutil, "disk_usage", lambda p: usage._replace(free=int(1.5 * size)))
    assert "less than 2 checkpoints" in save_checks.free_space_warning(tmp_path, size)
    monkeypatch.setattr(save_checks.shutil, "disk_usage", lambda p: usage._replace(free=3 * size))
    assert save_checks.free_space_warning(tmp_path, size) is None


def test_write_failure_names_path_and_os_error(tmp_path, monkeypatch):
    import errno as _errno

    from megatron_fixedcode.checkpoint import save_checks

    try:
        try:
            raise OSError(_errno.ENOSPC, os.strerror(_errno.ENOSPC), str(tmp_path / "x.distcp"))
        except OSError as e:
            raise RuntimeError("writer failed") from e
    except RuntimeError as e:
        err = save_checks.checkpoint_write_error(tmp_path, e)
    assert (
        str(err)
        == f"cannot write checkpoint {tmp_path / 'x.distcp'}: no space left on device; the last complete checkpoint is kept"
    )
    usage = save_checks.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(save_checks.shutil, "disk_usage", lambda p: usage._replace(free=0))
    err = save_checks.checkpoint_write_error(
        tmp_path, RuntimeError("[enforce fail at inline_container.cc:672] unexpected pos 704 vs 598")
    )
    assert "no space left on device" in str(err) and str(tmp_path) in str(err)


@pytest.mark.slow
def test_trainer_refuses_save_under_a_file_before_step_one(tmp_path):
    """A --save under a regular file was found at the first save, after that
    many steps; now before any process group, model or step (exit 2, one line)."""
    from tests.helpers.pretrain import data_args, pretrain, write_corpus

    (tmp_path / "file").write_text("x")
    metrics = tmp_path / "metrics.jsonl"
    proc = pretrain(
        "--train-iters",
        "2",
        "--save",
        str(tmp_path / "file" / "ckpt"),
        "--metrics-file",
        str(metrics),
        *data_args(write_corpus(tmp_path), "document_windows"),
        check=False,
    )
    refused(proc, f"--save {tmp_path / 'file' / 'ckpt'}: cannot create the directory: not a directory")
    assert not metrics.exists()


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_trainer_refuses_read_only_save_before_step_one(tmp_path):
    from tests.helpers.pretrain import data_args, pretrain, write_corpus

    (tmp_path / "ro").mkdir()
    (tmp_path / "ro").chmod(0o500)
    proc = pretrain(
        "--train-iters",
        "2",
        "--save",
        str(tmp_path / "ro"),
        *data_args(write_corpus(tmp_path), "document_windows"),
        check=False,
    )
    refused(proc, f"--save {tmp_path / 'ro'}: not writable: permission denied")


_FULL_DISK_AT_STEP_2 = """
    import errno, os, sys
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    def full_disk_open(path, mode="r", *args, **kwargs):  # the files of the step-2 checkpoint meet a full disk
        if "iter_0000002" in str(path) and "w" in mode:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return open(path, mode, *args, **kwargs)

    filesystem_async.open = full_disk_open  # where megatron-core's checkpoint writer opens its shard files
    import shutil
    from megatron_fixedcode.checkpoint import save_checks
    real_usage = shutil.disk_usage
    def full_disk_usage(path):  # and a full disk has no free bytes (megatron-core 0.19 passes on only "OSError")
        usage = real_usage(path)
        return usage._replace(free=0) if "iter_0000002" in str(path) else usage
    save_checks.shutil.disk_usage = full_disk_usage
    from megatron_fixedcode.pretrain import main
    sys.exit(main({argv!r}))
"""


@pytest.mark.slow
def test_full_disk_during_save_names_path_and_keeps_last_good_checkpoint(tmp_path):
    """A full disk at the second save (step 2) gave torch's
    ``unexpected pos 704 vs 598``; now one line names the file and "no space left on device",
    exit code 2, and ``latest`` still names the verified step-1 checkpoint."""
    from megatron_fixedcode import checkpoint
    from tests.helpers.pretrain import TINY, data_args, write_corpus

    ckpt = tmp_path / "ckpt"
    argv = [
        *TINY,
        "--train-iters",
        "3",
        "--save",
        str(ckpt),
        "--save-interval",
        "1",
        *data_args(write_corpus(tmp_path), "document_windows"),
    ]
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_FULL_DISK_AT_STEP_2.format(argv=argv))],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # megatron-core's writer logs the OSError of its worker too (one line; two on 0.19)
    refused(
        proc,
        f"cannot write checkpoint {ckpt / 'iter_0000002'}",
        "no space left on device",
        "the last complete checkpoint is kept",
        also_from="megatron.core.dist_checkpointing",
    )
    assert checkpoint.latest_step(ckpt) == 1
    assert checkpoint.verified_step(ckpt) == 1
    assert not (ckpt / "iter_0000002").exists()  # the partial save is not left to look like a checkpoint


# --------------------------------------------------------------------------- 13: huge documents


def test_document_above_size_limit_refused_with_file_line(tmp_path, small_tokenizer):
    """A 50 MB document needed 7 GB to index; records above
    --max-document-bytes (default 8 MiB) are refused as FILE:LINE before tokenizing."""
    corpus = tmp_path / "big.jsonl"
    big = "word " * ((8 << 20) // 5 + 10)  # just above 8 MiB
    corpus.write_text(json.dumps({"id": "a", "text": "small doc"}) + "\n" + json.dumps({"id": "b", "text": big}) + "\n")
    argv = _preprocess_argv(corpus, tmp_path / "out", small_tokenizer)
    sys.path.insert(0, str(REPO / "tools"))
    import preprocess_data

    proc = subprocess.run(
        [sys.executable, "tools/preprocess_data.py", *argv], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: {corpus}:2: key 'text' holds ")
    assert "--max-document-bytes 8388608" in proc.stderr
    # raising the limit indexes it; skipping counts it
    assert (
        preprocess_data.main(argv + ["--max-document-bytes", str(16 << 20), "--output-prefix", str(tmp_path / "ok")])
        == 0
    )
    assert preprocess_data.main(argv + ["--skip-bad-documents", "--output-prefix", str(tmp_path / "skip")]) == 0
    summary = json.loads((tmp_path / "skip_summary.json").read_text())
    assert summary["skipped"]["count"] == 1


@pytest.mark.slow
def test_a_prefix_reindexed_with_another_corpus_gets_a_new_sample_index_and_refuses_resume(tmp_path):
    """Megatron's GPT index cache (beside the data) was keyed by path, seed,
    length and tokenizer only: a prefix re-indexed with a larger corpus trained on the old sample
    map (step-1 loss 4.5% off), and a resume continued on other data."""
    import numpy as np

    from tests.helpers.data import write_indexed_dataset
    from tests.helpers.pretrain import pretrain, read_metrics

    rng = np.random.default_rng(1)

    def corpus(n):
        return [rng.integers(1, 500, size=int(rng.integers(40, 120))) for _ in range(n)]

    small, large = corpus(60), corpus(160)
    prefix, fresh = tmp_path / "data" / "corpus", tmp_path / "fresh" / "corpus"
    prefix.parent.mkdir()
    fresh.parent.mkdir()
    common = ["--dataset-type", "gpt", "--train-iters", "2", "--eval-iters", "1", "--split", "100,0,0"]
    write_indexed_dataset(prefix, small, dtype=np.uint16)
    pretrain(*common, "--data-path", str(prefix), "--save", str(tmp_path / "ckpt"))
    write_indexed_dataset(prefix, large, dtype=np.uint16)  # the same prefix, another corpus
    write_indexed_dataset(fresh, large, dtype=np.uint16)  # the same corpus where no cache exists
    for where, path in (("reindexed", prefix), ("fresh", fresh)):
        pretrain(*common, "--data-path", str(path), "--metrics-file", str(tmp_path / f"{where}.jsonl"))
    reindexed, first = (read_metrics(tmp_path / f"{w}.jsonl") for w in ("reindexed", "fresh"))
    assert [r["loss"] for r in reindexed] == [r["loss"] for r in first]  # the new corpus's samples
    proc = pretrain(
        *common, "--data-path", str(prefix), "--load", str(tmp_path / "ckpt"), "--train-iters", "2", check=False
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "data_fingerprint" in out and "re-indexed" in out, out[-2000:]
