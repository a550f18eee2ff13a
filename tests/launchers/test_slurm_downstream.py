"""--downstream-eval-tasks under the real local Slurm cluster (scripts/slurm_local.sh; tests/helpers/slurm.py): a
training job submitted with sbatch submits one evaluation job per checkpoint due (an sbatch of its own, no
dependency), training does not wait for them, and both checkpoints end with their scores in TensorBoard and the
JSONL. Own module, so pytest-xdist (--dist loadfile) runs it beside the other Slurm tests."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_fixedcode.eval import checkpoint_scores as cs
from tests.helpers import SMOLLM2_TOKENIZER
from tests.helpers.pretrain import TINY_TOKENIZER_VOCAB, data_args, write_corpus
from tests.helpers.slurm import ROOT, sacct, wait_done

pytestmark = pytest.mark.slow
SMALL = ["--nodes=1", "--ntasks=1", "--cpus-per-task=1", "--mem=2G", "--oversubscribe", "--time=10"]


def test_each_checkpoint_is_scored_by_an_sbatch_job_of_its_own(slurm, tmp_path):
    pytest.importorskip("lm_eval")
    (tmp_path / "data").mkdir()
    corpus = write_corpus(tmp_path / "data")
    save, logs = tmp_path / "ckpt", tmp_path / "logs"
    train = [
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
        "--tokenizer-model",
        str(SMOLLM2_TOKENIZER),
        "--metrics-file",
        str(logs / "metrics.jsonl"),
        "--tensorboard-dir",
        str(logs / "tb"),
        "--downstream-eval-tasks",
        "piqa_local",
        "--downstream-eval-interval",
        "2",
        "--downstream-eval-limit",
        "2",
        f"--downstream-eval-sbatch={' '.join(SMALL[2:])}",
        *data_args(corpus, "gpt"),
    ]
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\nexec " + shlex.join(map(str, train)) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_", "SBATCH_"))}
    env.update(
        PATH=f"{Path(sys.executable).parent}:{env['PATH']}",
        PYTHONPATH=str(ROOT),
        OMP_NUM_THREADS="1",
        PYTHONWARNINGS="ignore",
        TOKENIZERS_PARALLELISM="false",
        HF_DATASETS_CACHE=str(tmp_path / "hf"),
    )
    res = subprocess.run(
        ["sbatch", "--parsable", *SMALL, f"--output={tmp_path}/slurm-%j.out", str(script)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().split(";")[0]
    wait_done(job, tmp_path, 400)
    out = (tmp_path / f"slurm-{job}.out").read_text()
    assert sacct(job) == ("COMPLETED", "0:0"), out[-4000:]
    evals = {step: json.loads(cs.job_file(save, step, ".job").read_text())["slurm_job"] for step in (2, 4)}
    assert all(f"checkpoint step {s}: submitted Slurm job {j}" in out for s, j in evals.items()), out[-4000:]
    for step, eval_job in evals.items():
        wait_done(eval_job, tmp_path, 400)
        log = cs.job_file(save, step, ".log").read_text()
        assert sacct(eval_job) == ("COMPLETED", "0:0"), log[-4000:]
    records = cs.read_scores(logs / cs.JSONL_NAME)
    assert sorted((r["step"], r["task"]) for r in records) == [(2, "piqa_local"), (4, "piqa_local")]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    steps = []
    for path in sorted((logs / "tb").glob("events.out.tfevents.*downstream*")):
        acc = EventAccumulator(str(path))
        acc.Reload()
        steps += [e.step for e in acc.Scalars("downstream/piqa_local/acc")]
    assert sorted(steps) == [2, 4]
