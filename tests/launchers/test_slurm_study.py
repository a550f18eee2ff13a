"""Paper 2's whole study graph under the real local Slurm cluster (scripts/slurm_local.sh; fixture and
helpers in tests/helpers/slurm.py): examples/paper2_study.sh with the tiny CPU recipe, four shards cut from
the Gutenberg books of tests/assets, the local evaluation tasks and one CPU rank per training, through
index array -> manifest -> train-<v> -> export-<v> -> eval-<v> -> report for learned and binary.
Own module, so pytest-xdist (--dist loadfile) runs it beside tests/launchers/test_slurm.py."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ASSETS
from tests.helpers import SMOLLM2 as TOKENIZER
from tests.helpers.slurm import ROOT, job_info, sacct, wait_done, wait_until

pytestmark = pytest.mark.slow
NAMES = [
    "index",
    "manifest",
    "train-learned",
    "export-learned",
    "eval-learned",
    "train-binary",
    "export-binary",
    "eval-binary",
    "report",
]


def _corpus(directory: Path) -> None:
    texts = []
    for p in sorted((ASSETS / "corpus" / "gutenberg").glob("*.txt")):
        texts += [
            t.strip()
            for t in re.split(r"\n\s*\n", p.read_text(encoding="utf-8", errors="replace"))
            if len(t.strip()) > 200
        ]
    directory.mkdir(parents=True)
    for s in range(4):
        with open(directory / f"shard{s:02d}.jsonl", "w") as f:
            for i, t in enumerate(texts[:1600][s::4]):
                f.write(json.dumps({"id": f"{s}:{i}", "text": t}) + "\n")


def _hashes(study: Path, *parts: str) -> dict[str, str]:
    return {
        str(p.relative_to(study)): hashlib.sha256(p.read_bytes()).hexdigest()
        for part in parts
        for p in sorted((study / part).rglob("*"))
        if p.is_file() and "logs" not in p.relative_to(study).parts[:2] and not p.name.endswith(".lock")
    }


def test_study_graph_resumes_a_cancelled_training_to_its_report(slurm, tmp_path):
    """Run 1 is submitted held (--hold); index task 0 alone is released. Run 2, while the array is partly
    done (0 COMPLETED, 1 PENDING), submits nothing; nor does run 3 once the array is done and its manifest
    job is not. Released, train-binary is scancelled as soon as it runs (in its start-up): its export, eval
    and the report are cancelled (--kill-on-invalid-dep). Run 4 resubmits exactly those four; every output
    finished before it stays byte-identical; the study ends with its report; run 5 finds it done."""
    pytest.importorskip("lm_eval")
    _corpus(tmp_path / "corpus")
    study = tmp_path / "study"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_", "SBATCH_"))}
    env.update(
        PATH=f"{Path(sys.executable).parent}:{env['PATH']}",
        VIRTUAL_ENV=sys.prefix,
        PYTHONPATH=str(ROOT),
        GPUS_PER_NODE="1",
        CPUS_PER_TASK="1",
        MFC_REQUIRE_CUDA="0",
        OMP_NUM_THREADS="1",
        SAVE_INTERVAL="100000",
        PYTHONWARNINGS="ignore",
        TOKENIZERS_PARALLELISM="false",
        HF_DATASETS_CACHE=str(tmp_path / "hf"),
    )
    cmd = [
        "bash",
        str(ROOT / "examples" / "paper2_study.sh"),
        "--study-dir",
        str(study),
        "--input",
        *map(str, sorted((tmp_path / "corpus").glob("*.jsonl"))),
        "--tokenizer-model",
        str(TOKENIZER),
        "--shards-per-task",
        "2",
        "--index-cpus",
        "1",
        "--max-parallel",
        "0",
        "--index-flags",
        "--id-key id --append-eod --valid-fraction 0.05 --split-seed 1234",
        "--variants",
        "learned",
        "binary",
        "--recipe",
        "examples/recipes/tiny_cpu.yaml",
        "--train-nodes",
        "1",
        "--gpus-per-node",
        "0",
        "--cpus-per-task",
        "1",
        "--eval-tasks",
        "piqa_local,lambada_local",
        "--eval-limit",
        "4",
        "--eval-batch-size",
        "4",
        "--eval-gpus",
        "0",
        "--",
        "--train-iters",
        "4",
        "--log-interval",
        "1",
        "--eval-interval",
        "2",
        "--eval-iters",
        "1",
    ]

    def run(*extra: str) -> str:
        res = subprocess.run([*cmd[:2], *extra, *cmd[2:]], env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        return res.stdout

    def ids() -> dict[str, str]:
        return {n: (study / "jobs" / f"{n}.id").read_text().strip() for n in NAMES}

    def submitted(out: str) -> list[str]:
        return re.findall(r"^(\S+): (?:array )?job \d+(?: \(tasks \S+\))?(?:,| after |$)", out, re.M)

    def logs() -> str:
        return "".join(f"\n== {p.name}\n" + p.read_text()[-2500:] for p in sorted((study / "logs").glob("*.out")))

    try:
        out = run("--hold")  # run 1, every job held
        assert submitted(out) == [n for n in NAMES if n != "manifest"], out
        job = ids()
        array = job["index"]
        subprocess.run(["scontrol", "hold", f"{array}_1"], check=True)
        subprocess.run(["scontrol", "release", f"{array}_0"], check=True)
        wait_until(
            lambda: (
                "COMPLETED"
                in subprocess.run(
                    ["sacct", "-n", "-X", "-P", "-j", f"{array}_0", "-o", "State"], capture_output=True, text=True
                ).stdout
            ),
            300,
            "index task 0",
        )

        out = run()  # run 2: index 0 COMPLETED, 1 PENDING; everything else PENDING
        assert submitted(out) == [] and ids() == job, out
        for n in NAMES:
            assert f"{n}: job {job[n]} is PENDING: not resubmitted" in out, out

        subprocess.run(["scontrol", "release", f"{array}_1"], check=True)
        wait_until(
            lambda: (
                subprocess.run(
                    ["sacct", "-n", "-X", "-P", "-j", array, "-o", "State"], capture_output=True, text=True
                ).stdout.split()
                == ["COMPLETED"] * 2
            ),
            300,
            "index task 1",
        )
        out = run()  # run 3: the array COMPLETED, its manifest job still PENDING
        assert submitted(out) == [] and ids() == job, out
        assert (
            f"index: job {array} ended COMPLETED, its manifest job {job['manifest']} is PENDING: not resubmitted" in out
        )

        subprocess.run(["scontrol", "release", *(job[n] for n in NAMES[1:])], check=True)
        wait_until(lambda: job_info(job["train-binary"]).get("JobState") == "RUNNING", 600, "train-binary to run")
        subprocess.run(["scancel", job["train-binary"]], check=True)
        for n in ("train-binary", "export-binary", "eval-binary", "report"):
            assert wait_done(job[n], tmp_path, 300)["JobState"] == "CANCELLED", n + logs()
        assert wait_done(job["train-learned"], tmp_path, 600)["JobState"] == "COMPLETED", logs()
        assert not (study / "report").exists()
        wait_until(
            lambda: all(sacct(job[n])[0].startswith("CANCELLED") for n in ("train-binary", "report")),
            60,
            "sacct to record the cancellations",
        )  # slurmdbd may lag the controller; the study reads sacct
        before = _hashes(study, "data", "runs/learned")  # finished: the index outputs, the learned training

        out = run()  # run 4: the cancelled training and what depends on it, nothing else
        assert submitted(out) == ["train-binary", "export-binary", "eval-binary", "report"], out
        assert f"train-binary: job {job['train-binary']} ended CANCELLED: resubmitting" in out
        assert "index: done" in out and "train-learned: done" in out
        rerun = ids()
        assert all(rerun[n] == job[n] for n in NAMES if "binary" not in n and n != "report")
        assert wait_done(rerun["report"], tmp_path, 900)["JobState"] == "COMPLETED", logs()
        after = _hashes(study, "data", "runs/learned")
        assert after == before and len(before) > 20

        assert re.search(r"^report: done", run(), re.M)  # run 5: nothing left
    finally:
        if (study / "jobs").is_dir():
            subprocess.run(["scancel", *(p.read_text().strip() for p in (study / "jobs").glob("*.id"))])

    report = json.loads((study / "report" / "report.json").read_text())
    assert sorted(report["runs"]) == ["binary", "learned"]
    manifest = json.loads((study / "data" / "manifest.json").read_text())
    for v, rec in report["runs"].items():
        steps = [
            json.loads(line)["step"]
            for line in (study / "runs" / v / "logs" / "metrics.jsonl").read_text().splitlines()
            if "loss" in json.loads(line)
        ]
        assert steps == [1, 2, 3, 4], (v, steps)  # binary: resumed where the cancel checkpointed, none repeated
        assert rec["step"] == rec["planned_steps"] == 4 and 0 < rec["tokens"] <= 4 * 8 * 64
        assert rec["tokenizer_fingerprint"] == manifest["tokenizer"]["fingerprint"] and rec["input_embedding"] == v
    assert {"piqa_local@0shot/acc", "piqa_local@0shot/acc_norm", "lambada_local@0shot/perplexity"} <= set(
        report["table"]
    )
    assert all(a["equal"] for a in report["audit"].values())
    assert (study / "report" / "loss_curves.png").is_file() and (study / "report" / "report.md").is_file()
