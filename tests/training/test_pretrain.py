"""The trainer end to end on CPU: learning, layouts, exact resume, budget, preemption, refusals."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from megatron_fixedcode.checkpoint import latest_step
from tests.helpers import REPO
from tests.helpers.pretrain import TINY, assert_same_steps, data_args, pretrain, read_metrics, write_corpus

pytestmark = pytest.mark.slow
VARIANTS = ("learned", "binary", "gf2")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def _is_complete_checkpoint(path) -> bool:
    """A distributed checkpoint megatron can load: its metadata.json and torch_dist's .metadata
    (megatron-core <= 0.16 also writes common.pt; from 0.17 that state is inside the checkpoint)."""
    from megatron.core import dist_checkpointing

    return dist_checkpointing.check_is_distributed_checkpoint(str(path)) and (path / ".metadata").exists()


@pytest.mark.parametrize("dataset_type", ["document_windows", "gpt"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_resume_is_bit_identical_and_loss_falls(tmp_path, corpus, variant, dataset_type):
    """8 steps straight (saving at step 4) vs. resuming from the step-4 checkpoint."""
    common = [
        "--input-embedding",
        variant,
        "--train-iters",
        "8",
        "--eval-interval",
        "4",
        *data_args(corpus, dataset_type),
    ]
    ckpt = str(tmp_path / "ckpt")
    pretrain(*common, "--save", ckpt, "--save-interval", "4", "--metrics-file", str(tmp_path / "straight.jsonl"))
    pretrain(*common, "--load", ckpt, "--ckpt-step", "4", "--metrics-file", str(tmp_path / "resumed.jsonl"))
    straight, resumed = read_metrics(tmp_path / "straight.jsonl"), read_metrics(tmp_path / "resumed.jsonl")
    assert [r["step"] for r in resumed] == [5, 6, 7, 8]
    assert_same_steps(straight, resumed)


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_input_interface_learns(tmp_path, corpus, variant):
    """Below the unigram entropy ln(128) = 4.85 only by using the input: the bigram is in the ids."""
    pretrain(
        "--input-embedding",
        variant,
        "--train-iters",
        "40",
        "--lr",
        "1e-2",
        "--eval-interval",
        "40",
        "--metrics-file",
        str(tmp_path / "m.jsonl"),
        *data_args(corpus, "document_windows"),
    )
    metrics = read_metrics(tmp_path / "m.jsonl")
    assert metrics[-1]["val_loss"] < 4.5, [round(m["loss"], 3) for m in metrics]


def test_interrupted_run_continues_exactly_on_two_ranks(tmp_path, corpus):
    """2N straight vs. N, a real stop (--exit-interval), and N more after --load; DP=2."""
    common = ["--input-embedding", "gf2", "--train-iters", "6", *data_args(corpus, "document_windows")]
    pretrain(*common, "--metrics-file", str(tmp_path / "straight.jsonl"), nproc=2)
    ckpt = str(tmp_path / "ckpt")
    pretrain(
        *common, "--save", ckpt, "--exit-interval", "3", "--metrics-file", str(tmp_path / "resumed.jsonl"), nproc=2
    )
    assert latest_step(ckpt) == 3
    pretrain(*common, "--save", ckpt, "--load", ckpt, "--metrics-file", str(tmp_path / "resumed.jsonl"), nproc=2)
    resumed = read_metrics(tmp_path / "resumed.jsonl")
    assert [r["step"] for r in resumed] == list(range(1, 7))
    assert_same_steps(read_metrics(tmp_path / "straight.jsonl"), resumed)


def test_two_ranks_and_one_write_the_same_sample_digest_each_step(tmp_path, corpus):
    """A run relaunched on fewer ranks with the same global and micro batch reads the same samples, grouped alike,
    each step (metrics.jsonl's ``samples``), and its losses agree to the summation order."""
    common = ["--input-embedding", "gf2", "--train-iters", "3", *data_args(corpus, "document_windows")]
    pretrain(*common, "--metrics-file", str(tmp_path / "one.jsonl"))
    pretrain(*common, "--metrics-file", str(tmp_path / "two.jsonl"), nproc=2)
    one, two = read_metrics(tmp_path / "one.jsonl"), read_metrics(tmp_path / "two.jsonl")
    assert [r["samples"] for r in two] == [r["samples"] for r in one]
    assert len({r["samples"] for r in one}) == 3 and all(len(r["samples"]) == 16 for r in one)
    assert [r["loss"] for r in two] == pytest.approx([r["loss"] for r in one], rel=1e-5)


@pytest.mark.parametrize(
    "layout",
    [
        ["--tensor-model-parallel-size", "2", "--sequence-parallel"],
        ["--pipeline-model-parallel-size", "2"],
        # Megatron-LM's spelling: 4 layers / 2 stages / 1 layer per chunk = 2 chunks
        ["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"],
        [],
    ],
    ids=["tp2sp", "pp2", "pp2-interleaved", "dp2"],
)
def test_first_step_loss_matches_one_rank(tmp_path, corpus, layout):
    """From the same weights (saved by one rank, loaded with --finetune at any layout)."""
    ckpt = str(tmp_path / "init")
    model = [
        "--input-embedding",
        "gf2",
        "--num-layers",
        "4",
        "--train-iters",
        "1",
        *data_args(corpus, "document_windows"),
    ]
    pretrain(*model, "--save", ckpt)
    args = [*model, "--load", ckpt, "--finetune"]
    pretrain(*args, "--metrics-file", str(tmp_path / "one.jsonl"))
    pretrain(*args, *layout, "--metrics-file", str(tmp_path / "two.jsonl"), nproc=2)  # [] = DP=2
    one, two = read_metrics(tmp_path / "one.jsonl")[0], read_metrics(tmp_path / "two.jsonl")[0]
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-5)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
    assert two["tokens"] == one["tokens"] == 8 * 32


def test_token_budget_stops_at_first_step_boundary_past_it(tmp_path, corpus):
    ckpt = tmp_path / "ckpt"
    pretrain(
        "--train-tokens",
        "1000",
        "--save",
        str(ckpt),
        "--metrics-file",
        str(tmp_path / "m.jsonl"),
        "--tensorboard-dir",
        str(tmp_path / "tb"),
        *data_args(corpus, "document_windows"),
    )
    assert list((tmp_path / "tb").glob("events.out.tfevents.*")), "no TensorBoard event file"
    metrics = read_metrics(tmp_path / "m.jsonl")
    assert [m["tokens"] for m in metrics] == [256, 512, 768, 1024]  # 3 steps < 1000 <= 4 steps
    assert latest_step(ckpt) == 4 and _is_complete_checkpoint(ckpt / "iter_0000004")
    from megatron.core import dist_checkpointing

    trainer_state = dist_checkpointing.load_common_state_dict(str(ckpt / "iter_0000004"))["trainer"]
    assert (trainer_state["step"], trainer_state["tokens"]) == (4, 1024)  # the counters live in the checkpoint


def test_sigterm_saves_a_complete_checkpoint_that_resumes(tmp_path, corpus):
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "m.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "megatron_fixedcode.pretrain",
        *TINY,
        "--train-iters",
        "100000",
        "--save",
        str(ckpt),
        "--exit-signal-handler",
        "--metrics-file",
        str(metrics),
        *data_args(corpus, "document_windows"),
    ]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 3):
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    step = latest_step(ckpt)
    assert step is not None and step >= 3, out[-3000:]
    assert _is_complete_checkpoint(ckpt / f"iter_{step:07d}")
    assert len(read_metrics(metrics)) == step  # saved exactly where it stopped
    # A shorter run than the checkpoint's schedule (100000 steps): keep that schedule, explicitly.
    pretrain(
        "--train-iters",
        str(step + 1),
        "--use-checkpoint-opt-param-scheduler",
        "--load",
        str(ckpt),
        "--metrics-file",
        str(tmp_path / "after.jsonl"),
        *data_args(corpus, "document_windows"),
        nproc=2,
    )
    assert [m["step"] for m in read_metrics(tmp_path / "after.jsonl")] == [step + 1]


def test_a_signal_during_evaluation_checkpoints_without_waiting_for_it(tmp_path, corpus):
    """SIGTERM while step 3's (long) evaluation runs: the evaluation stops at its next batch, nothing is
    recorded for it, the checkpoint is taken at step 3 and the run exits 0 with the signal as its reason."""
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "m.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "megatron_fixedcode.pretrain",
        *TINY,
        "--train-iters",
        "100",
        "--save",
        str(ckpt),
        "--exit-signal-handler",
        "--metrics-file",
        str(metrics),
        *data_args(corpus, "document_windows"),
        "--eval-interval",
        "3",
        "--eval-iters",
        "100000",
    ]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 2):
        time.sleep(0.2)
    time.sleep(2)  # step 3 trains in a fraction of this; its evaluation (100000 batches) would take an hour
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-3000:]
    assert "evaluation at step 3 stopped by a signal after" in out and "exiting at step 3 (signal)" in out, out[-3000:]
    assert latest_step(ckpt) == 3
    assert [("val_loss" in m, m["step"]) for m in read_metrics(metrics)] == [(False, 1), (False, 2), (False, 3)]


def test_resume_with_another_input_interface_is_refused(tmp_path, corpus):
    ckpt = str(tmp_path / "ckpt")
    pretrain(
        "--input-embedding", "binary", "--train-iters", "1", "--save", ckpt, *data_args(corpus, "document_windows")
    )
    proc = pretrain(
        "--input-embedding",
        "gf2",
        "--train-iters",
        "2",
        "--load",
        ckpt,
        *data_args(corpus, "document_windows"),
        check=False,
    )
    assert proc.returncode != 0
    assert "refusing to resume with a different input interface" in proc.stderr + proc.stdout
    assert "binary" in proc.stderr + proc.stdout and "gf2" in proc.stderr + proc.stdout


def test_checkpoint_saved_at_tp2_evaluates_identically_at_tp1(tmp_path, corpus):
    ckpt = str(tmp_path / "ckpt")
    data = data_args(corpus, "document_windows")
    pretrain("--train-iters", "2", "--save", ckpt, "--tensor-model-parallel-size", "2", *data, nproc=2)
    for tp, nproc in (("2", 2), ("1", 1)):
        pretrain(
            "--train-iters",
            "2",
            "--load",
            ckpt,
            "--skip-train",
            "--tensor-model-parallel-size",
            tp,
            "--metrics-file",
            str(tmp_path / f"eval_tp{tp}.jsonl"),
            *data,
            nproc=nproc,
        )
    tp2, tp1 = read_metrics(tmp_path / "eval_tp2.jsonl")[0], read_metrics(tmp_path / "eval_tp1.jsonl")[0]
    assert tp1["step"] == tp2["step"] == 2
    assert tp1["val_loss"] == pytest.approx(tp2["val_loss"], rel=1e-5)


def test_bad_flags_are_refused_before_any_work(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "megatron_fixedcode.pretrain",
            *TINY,
            "--train-iters",
            "1",
            "--data-path",
            "x",
            "--pipeline-model-parallel-size",
            "3",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "--num-layers 2 is not divisible by --pipeline-model-parallel-size 3" in proc.stderr
    recipe = tmp_path / "r.yaml"
    recipe.write_text("num_layers: 2\nhiden_size: 64\n")
    proc = subprocess.run(
        [sys.executable, "-m", "megatron_fixedcode.pretrain", "--config", str(recipe)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "unknown key 'hiden_size'" in proc.stderr and str(recipe) in proc.stderr


def test_hugging_face_export_at_intervals(tmp_path, corpus):
    ckpt = tmp_path / "ckpt"
    pretrain(
        "--input-embedding",
        "gf2",
        "--train-iters",
        "2",
        "--save",
        str(ckpt),
        "--save-interval",
        "1",
        "--hf-export-interval",
        "2",
        *data_args(corpus, "document_windows"),
    )
    exports = sorted(p.name for p in (ckpt / "hf").iterdir() if p.is_dir())
    assert exports == ["iter_0000002"], exports  # step 1 is not a multiple of 2
    config = json.loads((ckpt / "hf" / "iter_0000002" / "config.json").read_text())
    from megatron_fixedcode.models import ModelConfig  # the code of TINY's model

    spec = ModelConfig(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        ffn_hidden_size=128,
        seq_length=32,
        vocab_size=1024,
        input_embedding="gf2",
    ).code_spec()
    assert spec.fingerprint in json.dumps(config)
