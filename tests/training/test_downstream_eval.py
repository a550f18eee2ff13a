"""--downstream-eval-tasks: each checkpoint due is scored by a job of its own while training goes on; the scores
land in TensorBoard at the checkpoint's step and in downstream.jsonl; a killed job leaves training untouched and
the next start fills the gap without duplicates (docs/training.md, "Downstream scores")."""

import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from megatron_fixedcode.arguments.downstream_flags import DownstreamConfig
from megatron_fixedcode.arguments.parse import parse_pretrain_args
from megatron_fixedcode.arguments.logging_flags import LoggingConfig
from megatron_fixedcode.eval import checkpoint_scores as cs
from megatron_fixedcode.training.downstream_evals import DownstreamEvals
from tests.helpers import REPO, SMOLLM2_TOKENIZER
from tests.helpers.pretrain import TINY, TINY_TOKENIZER_VOCAB, data_args, write_corpus

TASKS = "piqa_local,lambada_local"
FLAGS = [
    "--downstream-eval-tasks",
    TASKS,
    "--downstream-eval-interval",
    "2",
    "--downstream-eval-limit",
    "2",
    "--downstream-eval-batch-size",
    "4",
]


def _refusal(capsys, *args) -> str:
    with pytest.raises(SystemExit) as e:
        parse_pretrain_args([*TINY, "--mock-data", "--train-iters", "4", "--dry-run", *args])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ": error: " in err[0], err
    return err[0]


def test_the_flags_are_refused_before_the_first_step(capsys, tmp_path, monkeypatch):
    tok = ["--tokenizer-model", str(SMOLLM2_TOKENIZER), "--vocab-size", "49152"]
    save = ["--save", str(tmp_path / "ckpt"), "--save-interval", "2"]
    assert "it needs --save" in _refusal(capsys, *tok, *FLAGS)
    assert "go together" in _refusal(capsys, *tok, *save, "--downstream-eval-tasks", TASKS)
    assert "not a multiple of --save-interval 2" in _refusal(
        capsys, *tok, *save, *FLAGS[:2], "--downstream-eval-interval", "3"
    )
    assert "needs its tokenizer" in _refusal(capsys, *save, *FLAGS)
    line = _refusal(capsys, *tok, *save, "--downstream-eval-tasks", "piqa_local:x", "--downstream-eval-interval", "2")
    assert "--downstream-eval-tasks 'piqa_local:x'" in line
    # an unknown name goes to lm-eval's own index (seconds): a stand-in index here
    import lm_eval.tasks

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", lambda **kw: types.SimpleNamespace(all_tasks=["piqa"]))
    assert "unknown lm-eval task 'no_such_task'" in _refusal(
        capsys, *tok, *save, "--downstream-eval-tasks", "piqa,no_such_task", "--downstream-eval-interval", "2"
    )
    monkeypatch.setenv("MFC_SHARED_DATA", str(tmp_path))
    (tmp_path / "eval").mkdir()
    line = _refusal(capsys, *tok, *save, *FLAGS)
    assert "--downstream-eval-tasks piqa_local: " in line and "valid.jsonl not found" in line
    monkeypatch.undo()
    cfg = parse_pretrain_args([*TINY, "--mock-data", "--train-iters", "4", "--dry-run", *tok, *save, *FLAGS])
    assert cfg.inert == [] and cfg.args.downstream_eval_tasks == TASKS


def test_scores_file_records_and_tags(tmp_path):
    path = tmp_path / "downstream.jsonl"
    logs = tmp_path / "logs"
    assert cs.scores_file(str(tmp_path / "ckpt"), str(logs / "m.jsonl")) == logs / cs.JSONL_NAME
    cs.append_scores(
        path, [{"step": 2, "task": "piqa_local", "metrics": {"acc": 0.5}, "protocol": cs.protocol(TASKS, 2)}]
    )
    with open(path, "a") as f:
        f.write('{"step": 4, "task": "pi')  # the torn line of a killed writer
    assert cs.scored_steps(path, TASKS, 2) == {2} and cs.scored_steps(path, TASKS, 3) == set()
    assert cs.task_tag("piqa_local@0shot") == "piqa_local" and cs.task_tag("mmlu@5shot") == "mmlu@5shot"


def test_wandb_gets_the_scores_in_the_training_run_on_an_axis_of_its_own(monkeypatch):
    calls = []
    run = types.SimpleNamespace(
        define_metric=lambda *a, **k: calls.append(("define", a, k)),
        log=lambda values: calls.append(("log", values)),
        finish=lambda: calls.append("finish"),
    )
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=lambda **k: calls.append(("init", k)) or run))
    cs.write_wandb("proj", "abc123", None, 4, {"downstream/piqa_local/acc": 0.5})
    assert calls[0] == ("init", {"project": "proj", "id": "abc123", "name": None, "resume": "allow"})
    assert ("define", ("downstream/*",), {"step_metric": "downstream/step"}) in calls
    assert ("log", {"downstream/piqa_local/acc": 0.5, "downstream/step": 4}) in calls and calls[-1] == "finish"


def _stand_in(tmp_path, steps, latest, **args):
    save = tmp_path / "ckpt"
    for s in steps:
        (save / f"iter_{s:07d}").mkdir(parents=True)
        (save / f"iter_{s:07d}" / "checksums.json").write_text("{}")
    (save / "latest_checkpointed_iteration.txt").write_text(str(latest))
    logging_flags = {k: args.pop(k, None) for k in ("tensorboard_dir", "wandb_project", "wandb_exp_name")}
    cfg = types.SimpleNamespace(
        downstream=DownstreamConfig(tasks=TASKS, interval=2, limit=2.0, **args),
        schedule=types.SimpleNamespace(skip_train=False),
        checkpoint=types.SimpleNamespace(save=str(save)),
        logging=LoggingConfig(log_interval=1, metrics_file=None, **logging_flags),
    )
    trainer = types.SimpleNamespace(cfg=cfg, ranks={"rank": 0}, max_steps=5, wandb_run_id=None)
    evals = DownstreamEvals(trainer)
    evals.launched = []
    evals._launch = evals.launched.append
    return evals, save


def test_a_start_launches_only_what_lacks_scores_and_a_job(tmp_path):
    evals, save = _stand_in(tmp_path, [1, 2, 4, 5, 6], latest=5)
    cs.append_scores(
        evals.scores,
        [{"step": s, "task": "piqa_local", "metrics": {}, "protocol": cs.protocol(TASKS, 2.0)} for s in (2, 6)],
    )
    lock = cs.acquire(save, 4, wait_s=0)  # a job of step 4 runs
    try:
        evals.start(5)
        # 1: not due; 2: scored; 4: running; 5: the last; 6: after the resumed step (its score dropped)
        assert evals.launched == [5]
        assert cs.scored_steps(evals.scores, TASKS, 2.0) == {2}
        evals.saved(5)  # started once by this process
        assert evals.launched == [5]
    finally:
        lock.release()
    (save / "downstream" / "iter_0000004.job").write_text(json.dumps({"pid": os.getpid()}) + "\n")
    evals.started.clear()
    evals.saved(5)  # a pid that is not an evaluation job (reused) does not hold step 4 back
    assert evals.launched == [5, 4, 5]
    evals.started.clear()
    evals.saved(3)  # a run at step 3 (a fresh one into an earlier run's --save): not the checkpoints it overwrites
    assert evals.launched == [5, 4, 5]


def test_pruning_keeps_a_checkpoint_until_its_evaluation_scored_it(tmp_path, caplog):
    """--ckpt-keep-last 1 with every step due: a checkpoint whose job is queued or running, or not yet started,
    stays; once scored it goes at the next save; one whose job ended without scores goes, said once."""
    from megatron_fixedcode.checkpoint.save import _prune

    evals, save = _stand_in(tmp_path, [2, 4, 6], latest=6)
    (save / "downstream").mkdir()
    cs.append_scores(evals.scores, [{"step": 2, "task": "t", "metrics": {}, "protocol": cs.protocol(TASKS, 2.0)}])
    lock = cs.acquire(save, 4, wait_s=0)  # step 4's job runs
    (save / "downstream" / "iter_0000004.job").write_text(json.dumps({"pid": 1}) + "\n")
    try:
        with caplog.at_level("INFO"):
            _prune(save, 1, 6, keep=evals.keep)
            assert sorted(p.name for p in save.glob("iter_*")) == ["iter_0000004", "iter_0000006"]
            _prune(save, 1, 6, keep=evals.keep)  # said once
        assert caplog.text.count("keeping checkpoint step 4") == 1
    finally:
        lock.release()
    # the job ended (no lock, pid not an evaluation) without scores: let go, with the reason
    caplog.clear()
    with caplog.at_level("INFO"):
        _prune(save, 1, 6, keep=evals.keep)
    assert sorted(p.name for p in save.glob("iter_*")) == ["iter_0000006"]
    assert "pruning checkpoint step 4 unscored: its downstream evaluation job" in caplog.text
    # a checkpoint not yet handed to a job stays; once its scores are in, the next save prunes it
    (save / "iter_0000008").mkdir()
    _prune(save, 1, 8, keep=evals.keep)
    assert sorted(p.name for p in save.glob("iter_*")) == ["iter_0000006", "iter_0000008"]
    cs.append_scores(evals.scores, [{"step": 6, "task": "t", "metrics": {}, "protocol": cs.protocol(TASKS, 2.0)}])
    _prune(save, 1, 8, keep=evals.keep)
    assert sorted(p.name for p in save.glob("iter_*")) == ["iter_0000008"]


def test_jobs_of_their_own_leave_the_launchs_variables_behind():
    from megatron_fixedcode.utils.job_env import standalone_env

    launch = {
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_ERROR_FILE": "/tmp/e.json",
        "TORCHELASTIC_RUN_ID": "7",
        "GROUP_WORLD_SIZE": "2",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "n1",
        "MASTER_PORT": "29500",
        "MFC_EXIT_RECORD": "/logs/exit-7.json",
        "MFC_STOP_FILE": "/logs/stop-7",
        "MFC_NODE_LOG_DIR": "/logs",
        "MFC_LAUNCH_TOKEN": "7.0.1.4242",  # the node script ends what carries it when the launch ends
    }
    kept = {"PATH": "/bin", "OMP_NUM_THREADS": "1", "MFC_REQUIRE_CUDA": "0", "HF_HOME": "/hf"}
    assert standalone_env({**launch, **kept}) == kept


# ---------------------------------------------------------------------------------------------- end to end


def _wait_jobs(save: Path, steps, timeout=400):
    """Until the background jobs of ``steps`` (recorded in SAVE/downstream/iter_N.job) have exited."""
    deadline = time.monotonic() + timeout
    for step in steps:
        pid = json.loads(cs.job_file(save, step, ".job").read_text())["pid"]
        while _evaluating(pid):
            if time.monotonic() > deadline:
                log = cs.job_file(save, step, ".log").read_text()
                pytest.fail(f"the evaluation of step {step} did not end:\n{log[-4000:]}")
            time.sleep(0.5)


def _evaluating(pid: int) -> bool:
    try:
        return b"checkpoint_scores" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _tb_scalars(directory: Path) -> list[tuple[str, int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = []
    for path in sorted(directory.glob("events.out.tfevents.*downstream*")):
        acc = EventAccumulator(str(path))
        acc.Reload()
        out += [(tag, e.step, e.value) for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)]
    return sorted(out)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Train 4 steps (checkpoints 2 and 4); the job of step 2 is killed while training goes on; a second start
    of the finished run fills the gap."""
    pytest.importorskip("lm_eval")
    root = tmp_path_factory.mktemp("downstream")
    (root / "data").mkdir()
    corpus = write_corpus(root / "data")
    save = root / "ckpt"
    args = [
        sys.executable,
        "-m",
        "megatron_fixedcode.pretrain",
        *TINY_TOKENIZER_VOCAB,
        "--train-iters",
        "4",
        "--seq-length",
        "64",
        "--save-interval",
        "2",
        "--save",
        str(save),
        "--load",
        str(save),
        "--tokenizer-model",
        str(SMOLLM2_TOKENIZER),
        "--metrics-file",
        str(root / "logs" / "metrics.jsonl"),
        "--tensorboard-dir",
        str(root / "tb"),
        *FLAGS,
        *data_args(corpus, "gpt"),
    ]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", "HF_DATASETS_CACHE": str(root / "hfd")}
    trainer = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    marker = cs.job_file(save, 2, ".job")
    while not marker.exists() and trainer.poll() is None:
        time.sleep(0.1)
    killed = json.loads(marker.read_text())["pid"]
    os.killpg(killed, signal.SIGKILL)  # its own session: the trainer is not in it
    first = trainer.communicate(timeout=300)[0]
    _wait_jobs(save, [4])
    after_kill = cs.read_scores(root / "logs" / cs.JSONL_NAME)
    second = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    _wait_jobs(save, [2])
    return {
        "root": root,
        "save": save,
        "first": (trainer.returncode, first),
        "after_kill": after_kill,
        "second": (second.returncode, second.stdout + second.stderr),
    }


@pytest.mark.slow
def test_killing_an_evaluation_leaves_training_untouched(run):
    code, out = run["first"]
    assert code == 0, out[-4000:]
    assert [json.loads(line)["step"] for line in (run["root"] / "logs" / "metrics.jsonl").read_text().splitlines()] == [
        1,
        2,
        3,
        4,
    ]
    assert "downstream evaluation of checkpoint step 2: started process" in out
    assert {r["step"] for r in run["after_kill"]} == {4}  # the killed job wrote nothing


@pytest.mark.slow
def test_every_checkpoint_ends_with_its_scores_once(run):
    code, out = run["second"]
    assert code == 0, out[-4000:]
    assert "downstream evaluation of checkpoint step 2: started process" in out
    assert "checkpoint step 4:" not in out  # scored: not started again
    records = cs.read_scores(run["root"] / "logs" / cs.JSONL_NAME)
    assert sorted((r["step"], r["task"]) for r in records) == [
        (2, "lambada_local"),
        (2, "piqa_local"),
        (4, "lambada_local"),
        (4, "piqa_local"),
    ]
    piqa = next(r for r in records if r["task"] == "piqa_local")
    assert 0 <= piqa["metrics"]["acc"] <= 1 and piqa["metrics"]["sample_len"] == 2
    scalars = _tb_scalars(run["root"] / "tb")
    by_step = {}
    for tag, step, _ in scalars:
        by_step.setdefault(step, []).append(tag)
    assert sorted(by_step) == [2, 4]
    for tags in by_step.values():
        assert len(tags) == len(set(tags))
        assert {"downstream/piqa_local/acc", "downstream/lambada_local/perplexity"} <= set(tags)
    assert not list(run["save"].glob("downstream/*.hf"))  # the exports are removed


def test_the_study_report_plots_score_vs_step_for_each_run(tmp_path):
    pytest.importorskip("matplotlib")
    from megatron_fixedcode.study.report import downstream_curves, plot_downstream

    paths = {}
    for run, acc in (("learned", 0.5), ("binary", 0.6)):
        paths[run] = tmp_path / run / cs.JSONL_NAME
        cs.append_scores(
            paths[run],
            [
                {
                    "step": s,
                    "task": "piqa_local",
                    "protocol": cs.protocol(TASKS, None),
                    "metrics": {"acc": acc + s / 100, "acc_stderr": 0.1, "sample_len": 4},
                }
                for s in (2, 4)
            ],
        )
    curves = downstream_curves(paths)
    assert curves == {"piqa_local/acc": {"learned": [(2, 0.52), (4, 0.54)], "binary": [(2, 0.62), (4, 0.64)]}}
    assert plot_downstream(paths, tmp_path / "d.png").stat().st_size > 0
    assert plot_downstream({"x": tmp_path / "none.jsonl"}, tmp_path / "e.png") is None
