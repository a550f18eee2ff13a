"""The launch path under a real Slurm controller (scripts/slurm_local.sh: Slurm 22.05, two nodes on this
machine, fake GPUs, accounting): the paper-2 launcher submitted with `sbatch` exactly as its header shows,
the time-limit path (USR1 -> checkpoint -> requeue -> resume, losses equal to an uninterrupted run),
scancel, preemption, MAX_REQUEUES, two nodes, a bare sbatch, and the study's view of Slurm job states.

In CI (CI=true) or with MFC_SLURM=1 the fixture starts the cluster and a cluster that cannot start fails
the tests; elsewhere they skip unless `bash scripts/slurm_local.sh start` has been run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.disk import small_tmpfs
from tests.helpers import ASSETS
from tests.helpers.slurm import (
    SHRINK,
    SMALL,
    TOKENIZER,
    ROOT,
    job_info,
    launcher_env,
    sacct,
    sbatch,
    steps,
    wait_done,
    wait_for_step,
    wait_until,
    write_shards,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return write_shards(tmp_path_factory.mktemp("fwe"))


def test_bare_sbatch_fails_in_its_first_second_with_one_line(slurm, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATA_PATH", "VALID_DATA_PATH", "TOKENIZER")}
    job = sbatch(tmp_path, env)
    info = wait_done(job, tmp_path, 120)
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "2:0")
    assert (tmp_path / f"slurm-{job}.out").read_text().splitlines() == [
        "error: examples/recipes/paper2_1p7b_binary.yaml needs DATA_PATH VALID_DATA_PATH TOKENIZER exported before "
        "sbatch (see the launcher's header and examples/slurm_common.sh)"
    ]


def test_time_limit_checkpoints_requeues_and_resumes_like_an_uninterrupted_run(slurm, shards, tmp_path):
    """USR1 to the batch shell (what --signal=B:USR1@300 sends): the trainer checkpoints, every process
    exits 0, the job requeues itself and resumes; losses equal an uninterrupted job's, step by step."""
    last = 120
    interrupted, straight = tmp_path / "interrupted", tmp_path / "straight"
    job = sbatch(interrupted, launcher_env(shards, interrupted), *SHRINK, "--exit-interval", str(last))
    ref = sbatch(straight, launcher_env(shards, straight), *SHRINK, "--exit-interval", str(last))
    wait_for_step(interrupted, 3, job)
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True)
    info = wait_done(job, interrupted, 600)
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "1")
    wait_done(ref, straight)
    got, want = steps(interrupted), steps(straight)
    assert [r["step"] for r in want] == list(range(1, last + 1))
    assert [r["step"] for r in got] == list(range(1, last + 1))  # resumed after the checkpoint, none repeated
    for a, b in zip(got, want):
        assert (a["loss"], a["grad_norm"], a["lr"]) == (b["loss"], b["grad_norm"], b["lr"]), a["step"]
    # every shard reached the trainer (DATA_PATH holds one prefix per line)
    config = json.loads((interrupted / "logs" / f"config-{job}.json").read_text())
    assert config["train_data_path"] == [str(shards / f"{i:05d}_train_text_document") for i in range(3)]
    # the node log kept what was printed after the signal; the launcher's lines keep their date
    node = (interrupted / "logs" / "node0.log").read_text()
    saved = int(re.search(r"received signal 15: .*\n(?:.*\n)*?.*saved checkpoint \S+iter_0*(\d+)", node).group(1))
    assert 3 <= saved < last and f"start at step {saved}" in node
    out = (interrupted / f"slurm-{job}.out").read_text()
    assert "requeueing job" in out and "training exited with code 0" in out
    launcher_lines = [
        line for line in out.splitlines() if "requeue" in line or "training exited" in line or "USR1" in line
    ]
    assert launcher_lines and all(re.match(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] ", line) for line in launcher_lines)


def test_scancel_cancels_after_a_checkpoint(slurm, shards, tmp_path):
    job = sbatch(tmp_path, launcher_env(shards, tmp_path), *SHRINK, "--exit-interval", "100000")
    wait_for_step(tmp_path, 2, job)
    subprocess.run(["scancel", job], check=True)
    info = wait_done(job, tmp_path, 120)
    time.sleep(2)  # a requeue would show as PENDING again within this
    info = job_info(job)
    assert info["JobState"] == "CANCELLED" and info["Restarts"] == "0", info
    assert "not requeueing" in (tmp_path / f"slurm-{job}.out").read_text()
    assert re.search(
        r"received signal 15: .*\n(?:.*\n)*?.*saved checkpoint", (tmp_path / "logs" / "node0.log").read_text()
    )


def test_preemption_requeue_resumes_from_the_checkpoint_taken_on_sigterm(slurm, shards, tmp_path):
    """`scontrol requeue` (what preemption does): SIGTERM, the trainer checkpoints, Slurm requeues, the
    next run resumes there; the launcher does not requeue on its own."""
    last = 60
    job = sbatch(tmp_path, launcher_env(shards, tmp_path), *SHRINK, "--exit-interval", str(last))
    wait_for_step(tmp_path, 3, job)
    subprocess.run(["scontrol", "requeue", job], check=True)
    info = wait_done(job, tmp_path, 600)
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "1")
    assert [r["step"] for r in steps(tmp_path)] == list(range(1, last + 1))
    node = (tmp_path / "logs" / "node0.log").read_text()
    saved = int(re.search(r"received signal 15: .*\n(?:.*\n)*?.*saved checkpoint \S+iter_0*(\d+)", node).group(1))
    assert f"start at step {saved}" in node
    assert "requeueing job" not in (tmp_path / f"slurm-{job}.out").read_text()


def test_max_requeues_reached_ends_the_job_failed_as_unfinished(slurm, shards, tmp_path):
    """Past MAX_REQUEUES a time-limit checkpoint ends the job FAILED (exit 3: `afterok` dependents do not
    run on an unfinished model) with a last line that says so and how to continue."""
    job = sbatch(tmp_path, launcher_env(shards, tmp_path, MAX_REQUEUES="0"), *SHRINK, "--exit-interval", "100000")
    wait_for_step(tmp_path, 2, job)
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True)
    info = wait_done(job, tmp_path, 200)
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("FAILED", "3:0", "0")
    assert sacct(job) == ("FAILED", "3:0")
    saved = max(int(p.name[5:]) for p in (tmp_path / "ckpt").glob("iter_*"))
    last = (tmp_path / f"slurm-{job}.out").read_text().splitlines()[-1]
    assert last.startswith(f"unfinished: the job stopped at step {saved} of 1000 after MAX_REQUEUES=0"), last
    assert "submitting the same command again" in last


def test_slurms_own_requeue_does_not_count_against_max_requeues(slurm, shards, tmp_path):
    """MAX_REQUEUES=1 and one `scontrol requeue` (preemption's path): the time limit that follows still
    requeues, since the launcher counts only its own requeues."""
    job = sbatch(tmp_path, launcher_env(shards, tmp_path, MAX_REQUEUES="1"), *SHRINK, "--exit-interval", "100000")
    wait_for_step(tmp_path, 2, job)
    subprocess.run(["scontrol", "requeue", job], check=True)
    node_log = tmp_path / "logs" / "node0.log"
    wait_until(
        lambda: "iteration" in node_log.read_text().partition(f"job {job}, restart 1:")[2],
        400,
        "the second run's steps",
        tmp_path,
    )
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True)
    wait_until(lambda: job_info(job).get("Restarts") == "2", 400, "the launcher's requeue", tmp_path)
    subprocess.run(["scancel", job], check=True)
    wait_done(job, tmp_path, 200)
    out = (tmp_path / f"slurm-{job}.out").read_text()
    assert "requeueing job %s (the launcher's requeue 1 of MAX_REQUEUES=1)" % job in out, out[-3000:]
    assert (tmp_path / "logs" / f"requeues-{job}").read_text().strip() == "1"


def test_a_cancel_during_the_time_limit_checkpoint_wins_over_the_requeue(slurm, shards, tmp_path):
    job = sbatch(tmp_path, launcher_env(shards, tmp_path), *SHRINK, "--exit-interval", "100000")
    wait_for_step(tmp_path, 2, job)
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True)
    time.sleep(0.3)
    subprocess.run(["scancel", job], check=True)
    wait_done(job, tmp_path, 200)
    time.sleep(3)  # a requeue would show as PENDING (or RUNNING again) within this
    info = job_info(job)
    assert (info["JobState"], info["Restarts"]) == ("CANCELLED", "0"), info
    out = (tmp_path / f"slurm-{job}.out").read_text()
    assert "not requeueing" in out and "requeueing job" not in out, out[-3000:]


@pytest.fixture
def small_disk(tmp_path):
    """A 6 MiB tmpfs: room for the run's start-up checks, not for the tiny model's checkpoint (~40 MB)."""
    with small_tmpfs(tmp_path / "small-disk", "6m") as mount:
        yield mount


def test_a_time_limit_checkpoint_that_fails_ends_the_job_failed_without_a_requeue(slurm, shards, tmp_path, small_disk):
    job = sbatch(
        tmp_path,
        launcher_env(shards, tmp_path, CKPT_DIR=str(small_disk / "ckpt")),
        *SHRINK,
        "--exit-interval",
        "100000",
    )
    wait_for_step(tmp_path, 2, job)
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True)
    info = wait_done(job, tmp_path, 200)
    time.sleep(2)
    info = job_info(job)
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("FAILED", "2:0", "0"), info
    out = (tmp_path / f"slurm-{job}.out").read_text().splitlines()
    assert not any("requeueing job" in line for line in out)
    assert any(
        "the time-limit checkpoint did not complete (training exited with code 2): not requeueing" in line
        for line in out
    )
    assert out[-1].startswith("error: cannot write checkpoint") and "no space left on device" in out[-1], out[-5:]
    assert not any("ChildFailedError" in line or "enforce fail at inline_container" in line for line in out)
    assert not (small_disk / "ckpt" / "latest_checkpointed_iteration.txt").exists()


def test_a_refusal_only_the_ranks_see_ends_the_job_with_its_line_last_and_exit_2(slurm, shards, tmp_path):
    """A node without a GPU (MFC_REQUIRE_CUDA=1 on these CPU nodes): the batch shell cannot know, every rank
    refuses; the job ends FAILED 2:0 (torchrun alone would say 1) with the trainer's line last, not restarted."""
    job = sbatch(tmp_path, launcher_env(shards, tmp_path, MFC_REQUIRE_CUDA="1"), *SHRINK, "--exit-interval", "3")
    info = wait_done(job, tmp_path, 200)
    out = (tmp_path / f"slurm-{job}.out").read_text()
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "2:0"), out[-3000:]
    assert out.splitlines()[-1].startswith(
        "error: MFC_REQUIRE_CUDA=1 (set by the Slurm launchers) but torch sees no CUDA GPU"
    ), out[-3000:]
    assert json.loads((tmp_path / "logs" / f"exit-{job}.json").read_text())["code"] == 2
    node_log = (tmp_path / "logs" / "node0.log").read_text()
    assert "ChildFailedError" not in out
    if "ft_launcher" in node_log:  # exit 2 is not restarted: the rank asked ft_launcher to stop; one attempt ran
        assert "req=WorkloadControlRequest(action=WorkloadAction.ShutdownWorkload, description=exit 2: " in out
        assert node_log.count("ERROR:megatron_fixedcode.training.loop:MFC_REQUIRE_CUDA=1 (set by") == 1
    else:  # torchrun's own report stays in the node log, out of the Slurm output
        assert "torchrun: a worker failed; its report is in" in out and "ChildFailedError" in node_log


def _vocab512_tokenizer(path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"<|endoftext|>": 0, **{f"w{i}": i for i in range(1, 512)}}, unk_token="w1"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return path


def test_refusals_a_batch_shell_can_see_come_before_torchrun_in_one_line(slurm, shards, tmp_path):
    """A missing training prefix, a tokenizer whose vocabulary does not cover the data, a checkpoint
    directory of another model: FAILED 2:0 with one line and no rank started (no torchrun traceback)."""
    other = tmp_path / "other-model"
    cmd = [
        sys.executable,
        "-m",
        "megatron_fixedcode.pretrain",
        "--config",
        str(ROOT / "examples/recipes/paper2_1p7b_binary.yaml"),
        "--train-data-path",
        str(shards / "00000_train_text_document"),
        "--valid-data-path",
        str(shards / "00000_valid_text_document"),
        "--tokenizer-model",
        str(TOKENIZER),
        *SHRINK,
        "--hidden-size",
        "128",
        "--train-iters",
        "1",
        "--save",
        str(other),
        "--eval-iters",
        "0",
    ]
    assert subprocess.run(cmd, env=launcher_env(shards, tmp_path), cwd=ROOT, capture_output=True).returncode == 0
    cases = {
        "missing": (
            {"DATA_PATH": f"{shards}/00000_train_text_document\n{shards}/00009_train_text_document"},
            f"error: data_path {shards}/00009_train_text_document: {shards}/00009_train_text_document.idx not found",
        ),
        "vocab": (
            {"TOKENIZER": str(_vocab512_tokenizer(tmp_path / "vocab512.json"))},
            "is outside the vocabulary [0, 512)",
        ),
        "model": ({"CKPT_DIR": str(other)}, "checkpoint has hidden_size=128, this run hidden_size=64"),
    }
    jobs = {}
    for name, (extra, _) in cases.items():
        run = tmp_path / name
        env = launcher_env(shards, run, **extra)
        jobs[name] = sbatch(run, env, *SHRINK, "--exit-interval", "3")
    for name, (_, want) in cases.items():
        run = tmp_path / name
        info = wait_done(jobs[name], run, 200)
        out = (run / f"slurm-{jobs[name]}.out").read_text()
        assert (info["JobState"], info["ExitCode"]) == ("FAILED", "2:0"), (name, out[-3000:])
        lines = out.splitlines()
        assert want in lines[-1] and lines[-1].startswith("error: "), (name, lines[-5:])
        assert "torchrun" not in out and "Traceback" not in out and not (run / "logs" / "node0.log").exists(), name


def test_two_nodes_train_with_a_log_each(slurm, shards, tmp_path):
    job = sbatch(
        tmp_path, launcher_env(shards, tmp_path), *SHRINK, "--exit-interval", "3", sbatch_opts=["--nodes=2", *SMALL[1:]]
    )
    info = wait_done(job, tmp_path)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), (tmp_path / f"slurm-{job}.out").read_text()[
        -3000:
    ]
    for node in (0, 1):
        log = (tmp_path / "logs" / f"node{node}.log").read_text()
        assert f"node {node} of 2" in log and "--rdzv_endpoint mfc-node1:" in log
    assert [r["step"] for r in steps(tmp_path)] == [1, 2, 3]
    both = "".join((tmp_path / "logs" / f"node{n}.log").read_text() for n in (0, 1))
    assert "x 2 data-parallel" in both  # rank 0 is on whichever node c10d made node rank 0


def test_study_state_reads_every_array_task_and_falls_back_without_accounting(slurm, tmp_path):
    from megatron_fixedcode.study.slurm_submit import slurm_state

    script = tmp_path / "task.sh"
    script.write_text("#!/bin/bash\n[[ $SLURM_ARRAY_TASK_ID == 0 ]] || sleep 60\n")
    res = subprocess.run(
        ["sbatch", "--parsable", "--array=0-1", "--mem=100M", f"--output={tmp_path}/a-%a.out", str(script)],
        capture_output=True,
        text=True,
        check=True,
    )
    job = res.stdout.strip()
    try:
        wait_until(
            lambda: (
                "COMPLETED"
                in subprocess.run(
                    ["sacct", "-n", "-X", "-P", "-j", job, "-o", "State"], capture_output=True, text=True
                ).stdout
            ),
            60,
            "task 0",
        )
        assert slurm_state(job) == "RUNNING"  # 43_0 COMPLETED, 43_1 RUNNING: still in flight
        # without accounting storage sacct fails: squeue answers, and the study says so
        fake = tmp_path / "bin"
        fake.mkdir()
        (fake / "sacct").write_text(
            "#!/bin/sh\necho 'sacct: error: Slurm accounting storage is disabled' >&2\nexit 1\n"
        )
        (fake / "sacct").chmod(0o755)
        said = []
        path = os.environ["PATH"]
        os.environ["PATH"] = f"{fake}:{path}"
        try:
            assert slurm_state(job, said.append) == "RUNNING"
        finally:
            os.environ["PATH"] = path
        assert said and "squeue/scontrol" in said[0] and "accounting storage is disabled" in said[0]
    finally:
        subprocess.run(["scancel", job])


def _study(study: Path, *args: str, **env) -> str:
    res = subprocess.run(
        ["bash", str(ROOT / "examples" / "paper2_study.sh"), "--study-dir", str(study), "--stages", "report", *args],
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "VIRTUAL_ENV": sys.prefix,
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def test_study_leaves_a_queued_job_alone_and_resubmits_a_failed_one_alone(slurm, tmp_path):
    """examples/paper2_study.sh under sbatch: a re-run while the report job is queued submits nothing; the job
    fails (runs that differ in their tokenizer); after the fix the next re-run resubmits it alone; then done."""
    from megatron_fixedcode.study.layout import StudyLayout
    from megatron_fixedcode.study.record import write_json_atomic
    from tests.helpers.study import study_record as _record
    from tests.helpers.study import study_result as _result

    layout = StudyLayout(tmp_path / "study")
    for v in ("learned", "binary", "gf2"):
        write_json_atomic(layout.record(v), _record(v, **({"tokenizer_fingerprint": "x" * 16} if v == "gf2" else {})))
        write_json_atomic(layout.eval_result(v), _result(0.5))
    first = _study(layout.root, "--hold")  # held: stays PENDING
    job = re.search(r"^report: job (\d+)$", first, re.M).group(1)
    again = _study(layout.root)
    assert f"report: job {job} is PENDING: not resubmitted" in again
    subprocess.run(["scontrol", "release", job], check=True)
    assert wait_done(job, tmp_path, 120)["JobState"] == "FAILED"
    write_json_atomic(layout.record("gf2"), _record("gf2"))
    third = _study(layout.root)
    assert f"report: job {job} ended FAILED: resubmitting" in third
    rerun = re.search(r"^report: job (\d+)$", third, re.M).group(1)
    assert rerun != job and wait_done(rerun, tmp_path, 120)["JobState"] == "COMPLETED"
    assert sorted(json.loads((layout.report_dir / "report.json").read_text())["runs"]) == ["binary", "gf2", "learned"]
    assert "report: done" in _study(layout.root)


def _corpus_shards(directory: Path) -> list[Path]:
    """Six shards of Gutenberg paragraphs: Parquet, JSONL.gz and JSONL; one without ids, one truncated (bad),
    one eighty times bigger (the second shard of the task that is cancelled while writing it: seconds of
    indexing, so that the cancel lands inside it; six times was ~0.3 s, and a loaded machine lost the race)."""
    import gzip

    import pyarrow
    import pyarrow.parquet

    texts = []
    for path in sorted((ASSETS / "corpus" / "gutenberg").glob("*.txt")):
        texts += [
            p.strip() for p in re.split(r"\n\s*\n", path.read_text(encoding="utf-8", errors="replace")) if p.strip()
        ]
    directory.mkdir(parents=True)
    paths = []
    for s in range(6):
        name = f"s{s:02d}"
        chunk = texts[:3000][s::6] * (80 if name == "s03" else 1)
        records = [{"text": t} if name == "s01" else {"id": f"{name}:{i}", "text": t} for i, t in enumerate(chunk)]
        path = directory / (f"{name}.parquet", f"{name}.jsonl.gz", f"{name}.jsonl")[s % 3]
        if s % 3 == 0:
            pyarrow.parquet.write_table(pyarrow.Table.from_pylist(records), path)
        else:
            data = "".join(json.dumps(r) + "\n" for r in records).encode()
            path.write_bytes(gzip.compress(data, mtime=0) if s % 3 == 1 else data)
        if name == "s04":
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        paths.append(path)
    return paths


def test_shard_indexing_array_cancelled_task_resubmitted_alone_equals_one_process_indexing(slurm, tmp_path):
    """examples/preprocess_shards.sh: 6 shards in 3 array tasks, then the manifest job (afterany). Task 1 is
    scancelled while writing its second shard, task 2 holds a truncated shard: the manifest is refused. The
    same command again submits tasks 1 and 2 only (task 0's shards are complete); the outputs then equal
    one-process indexing byte for byte and the manifest lists the good shards."""
    from megatron_fixedcode.data.preprocess import PreprocessConfig, preprocess

    inputs, out = tmp_path / "in", tmp_path / "idx"
    paths = _corpus_shards(inputs)
    flags = ["--id-key", "id", "--append-eod", "--valid-fraction", "0.05", "--min-doc-tokens", "65"]
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "VIRTUAL_ENV": sys.prefix,
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }

    def submit() -> tuple[str, str, str]:
        res = subprocess.run(
            [
                "bash",
                str(ROOT / "examples" / "preprocess_shards.sh"),
                "--input",
                str(inputs),
                "--output-dir",
                str(out),
                "--tokenizer-model",
                str(TOKENIZER),
                "--array-size",
                "3",
                "--cpus-per-task",
                "1",
                "--time",
                "00:10:00",
                "--skip-failed",
                "--",
                *flags,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert res.returncode == 0, res.stdout + res.stderr
        return re.search(r"submitted: array job (\d+) \(tasks (\S+) of 3.*manifest job (\d+)", res.stdout).groups()

    def tasks(array: str, want: dict[str, str]) -> dict[str, str]:
        for _ in range(100):  # slurmdbd may lag the controller by a moment
            lines = subprocess.run(
                ["sacct", "-n", "-X", "-P", "-j", array, "-o", "JobID,State"], capture_output=True, text=True
            ).stdout.splitlines()
            # a task's line is JOBID_TASK|STATE; slurmdbd may briefly list the array's own record (bare JOBID)
            got = dict(m.groups() for m in (re.match(r"\d+_(\d+)\|(\w+)", line) for line in lines) if m)
            if got == want:
                break
            time.sleep(0.3)
        return got

    array, todo, manifest_job = submit()
    assert todo == "0-2"
    wait_until(lambda: (out / "s03_train_text_document.bin.tmp").exists(), 300, "task 1's second shard")
    subprocess.run(["scancel", f"{array}_1"], check=True)
    assert wait_done(manifest_job, tmp_path, 300)["JobState"] == "FAILED"
    want = {"0": "COMPLETED", "1": "CANCELLED", "2": "FAILED"}
    assert tasks(array, want) == want
    log = (out / "logs" / f"manifest-{manifest_job}.out").read_text()
    assert "s03 (missing)" in log and "re-submit" in log and not (out / "manifest.json").exists()
    assert f"error: shard s04: {inputs / 's04.jsonl.gz'}" in (out / "logs" / f"index-{array}_2.out").read_text()
    # the cancelled shard looks complete nowhere: no summary, its outputs at most as .tmp
    assert not (out / "s03_summary.json").exists()
    assert all(p.name.endswith((".tmp", ".lock")) for p in out.glob("s03_*")), sorted(out.glob("s03_*"))
    kept = {p.name: p.read_bytes() for p in out.glob("s0[01]_*")}

    array, todo, manifest_job = submit()  # the same command: tasks 1 (cancelled) and 2 (a failed shard) only
    assert todo == "1-2"
    assert wait_done(manifest_job, tmp_path, 300)["JobState"] == "COMPLETED"
    want = {"1": "COMPLETED", "2": "FAILED"}
    assert tasks(array, want) == want
    assert "task 1: 1 indexed, 1 already complete, 0 failed" in (out / "logs" / f"index-{array}_1.out").read_text()
    assert "excluded s04" in (out / "logs" / f"manifest-{manifest_job}.out").read_text()
    assert {p.name: p.read_bytes() for p in out.glob("s0[01]_*")} == kept and not list(out.glob("*.tmp"))

    # byte-identical to one process per shard (tools/preprocess_data.py for the shard without ids)
    good = [p for p in paths if not p.name.startswith("s04")]
    ref = tmp_path / "ref"
    for p in good:
        name = p.name.split(".")[0]
        if name == "s01":
            cli = [
                sys.executable,
                str(ROOT / "tools" / "preprocess_data.py"),
                "--input",
                str(p),
                "--output-prefix",
                str(ref / name),
                "--tokenizer-type",
                "HuggingFaceTokenizer",
                "--tokenizer-model",
                str(TOKENIZER),
                *flags,
            ]
            assert subprocess.run(cli, env=env, capture_output=True, timeout=300).returncode == 0
        else:
            preprocess(
                PreprocessConfig(
                    input=[str(p)],
                    output_prefix=str(ref / name),
                    tokenizer_type="HuggingFaceTokenizer",
                    tokenizer_model=str(TOKENIZER),
                    id_key="id",
                    append_eod=True,
                    valid_fraction=0.05,
                    min_doc_tokens=65,
                )
            )
    produced = {p.name: p.read_bytes() for p in sorted(out.glob("*_document.*"))}
    assert len(produced) == 5 * 4 and produced == {p.name: p.read_bytes() for p in sorted(ref.glob("*_document.*"))}
    manifest = json.loads((out / "manifest.json").read_text())
    assert [s["name"] for s in manifest["shards"]] == ["s00", "s01", "s02", "s03", "s05"]
    assert [e["name"] for e in manifest["excluded"]] == ["s04"]

    # without the bad shard nothing is left to index: the manifest step alone, no dependency
    res = subprocess.run(
        [
            "bash",
            str(ROOT / "examples" / "preprocess_shards.sh"),
            "--input",
            *map(str, good),
            "--output-dir",
            str(out),
            "--tokenizer-model",
            str(TOKENIZER),
            "--array-size",
            "3",
            "--dry-run",
            "--",
            *flags,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "# tasks to run: none (0 of 3;" in res.stdout, res.stdout + res.stderr
    assert "--array" not in res.stdout and "--dependency" not in res.stdout and "--manifest" in res.stdout
