"""The paper-2 study in one command: the Slurm job graph of examples/paper2_study.sh
(--dry-run), the study record's refusals and the report. The whole graph under a real Slurm cluster:
tests/launchers/test_slurm_study.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.study import study_record as _record
from tests.helpers.study import study_result as _result

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "paper2_study.sh"


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PATH=f"{Path(sys.executable).parent}:{env['PATH']}", VIRTUAL_ENV=sys.prefix, PYTHONPATH=str(REPO))
    return env


def _study(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *map(str, args)], env=env or _env(), capture_output=True, text=True, timeout=300
    )


def test_dry_run_prints_the_job_graph_with_its_dependencies(tmp_path):
    study = tmp_path / "study"
    res = _study(
        "--study-dir",
        study,
        "--input",
        "/data/fwe/*.parquet",
        "--tokenizer-model",
        tmp_path / "tok",
        "--train-nodes",
        "4",
        "--partition",
        "gpu",
        "--train-time",
        "12:00:00",
        "--dry-run",
    )
    assert res.returncode == 0, res.stderr
    out = res.stdout
    graph = dict(re.findall(r"^#   (\S+)\s+after (.*?)\s+to submit$", out, re.M))
    assert graph == {
        "index": "-",
        "manifest": "afterany:index",
        **{f"train-{v}": "afterok:manifest" for v in ("learned", "binary", "gf2")},
        **{f"export-{v}": f"afterok:train-{v}" for v in ("learned", "binary", "gf2")},
        **{f"eval-{v}": f"afterok:export-{v}" for v in ("learned", "binary", "gf2")},
        "report": "afterok:eval-learned afterok:eval-binary afterok:eval-gf2",
    }
    # resolved commands: the array indexing, the self-requeueing launcher per variant on the paper-2 recipe
    assert "examples/preprocess_shards.sh --input '/data/fwe/*.parquet'" in out
    for v in ("learned", "binary", "gf2"):
        block = out.split(f"## job train-{v} ")[1].split("## job")[0]
        assert "--nodes=4" in block and "--requeue" in block and "--signal=B:USR1@300" in block
        assert "--partition=gpu" in block and "--time=12:00:00" in block
        assert f"RECIPE=examples/recipes/paper2_1p7b_{v}.yaml" in block and f"mfc_launch --input-embedding {v}" in block
        assert f"DATA_MANIFEST={study}/data/manifest.json" in block
    assert "megatron_fixedcode.study.stages eval" in out and "megatron_fixedcode.study.stages report" in out
    assert not study.exists()  # nothing written, nothing submitted


def test_dry_run_subsets_and_finished_stages(tmp_path):
    """--variants/--stages pick jobs; a stage whose outputs exist is done and not submitted, and its
    dependents lose the dependency."""
    study = tmp_path / "study"
    (study / "exports" / "binary").mkdir(parents=True)
    (study / "exports" / "binary" / "config.json").write_text("{}")
    res = _study(
        "--study-dir", study, "--variants", "learned", "binary", "--stages", "export", "eval", "report", "--dry-run"
    )
    assert res.returncode == 0, res.stderr
    jobs = {name for name, _, _ in re.findall(r"^#   (\S+)\s+after (.*?)\s+(done|to submit)$", res.stdout, re.M)}
    assert jobs == {"export-learned", "eval-learned", "export-binary", "eval-binary", "report"}
    assert re.search(r"^#   export-binary .* done$", res.stdout, re.M)
    assert re.search(r"^#   export-learned .* to submit$", res.stdout, re.M)


def test_bad_options_are_one_line_exit_2(tmp_path):
    res = _study("--study-dir", tmp_path / "s", "--variants", "learned", "bitwise", "--stages", "train", "--dry-run")
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        "error: --variants learned bitwise: choose from learned binary gf2"
    ]
    res = _study("--study-dir", tmp_path / "s", "--dry-run")
    assert res.returncode == 2 and "the index stage needs --input and --tokenizer-model" in res.stderr


def test_a_second_invocation_must_describe_the_same_study(tmp_path):
    from megatron_fixedcode.study.graph import StudyOptions, check_fixed_options, save_options

    opts = StudyOptions(study_dir=str(tmp_path), mfc_root=str(REPO), eval_tasks="paper")
    save_options(opts)
    check_fixed_options(StudyOptions(study_dir=str(tmp_path), mfc_root=str(REPO), train_time="01:00:00"))
    with pytest.raises(ValueError, match=r"planned with eval_tasks='paper', not 'local'"):
        check_fixed_options(StudyOptions(study_dir=str(tmp_path), mfc_root=str(REPO), eval_tasks="local"))


@pytest.mark.parametrize("field", ["tokenizer_fingerprint", "data_manifest_fingerprint", "eval_protocol_hash"])
def test_report_refuses_runs_of_another_tokenizer_data_or_protocol(field):
    from megatron_fixedcode.study import report

    records = {"learned": _record("learned"), "binary": _record("binary", **{field: "x" * 64})}
    results = {"learned": _result(0.5), "binary": _result(0.6)}
    with pytest.raises(ValueError, match=rf"the runs differ in {field} \(learned .*, binary x+\)"):
        report.build(records, results, {})
    report.build({**records, "binary": _record("binary")}, results, {})  # the same: accepted


def test_report_table_audit_and_references(tmp_path):
    from megatron_fixedcode.study import report
    from megatron_fixedcode.study.layout import StudyLayout
    from megatron_fixedcode.study.record import write_json_atomic

    layout = StudyLayout(tmp_path)
    for v, acc, sha in (("learned", 0.5, "a" * 64), ("binary", 0.625, "b" * 64)):
        write_json_atomic(layout.record(v), _record(v))
        write_json_atomic(layout.eval_result(v), _result(acc, sha, truncated=1))
        layout.train_logs(v).mkdir(parents=True)
        layout.train_logs(v).joinpath("metrics.jsonl").write_text(
            "".join(
                json.dumps({"step": s, "loss": 10 - s, **({"val_loss": 9.5 - s} if s % 2 == 0 else {})}) + "\n"
                for s in range(1, 5)
            )
        )
    ref = tmp_path / "smollm2.json"
    ref.write_text(json.dumps({**_result(0.7), "label": "SmolLM2-135M"}))
    md_path = report.write_report(layout, ["learned", "binary"], [str(ref)])
    data = json.loads((layout.report_dir / "report.json").read_text())
    assert data["references"] == ["SmolLM2-135M"]
    assert data["table"]["piqa_local@0shot/acc"]["binary"] == {"value": 0.625, "stderr": 0.1}
    assert data["table"]["piqa_local@0shot/acc_norm"]["SmolLM2-135M"]["value"] == pytest.approx(0.71)
    assert data["table"]["lambada_local@0shot/perplexity"]["learned"]["value"] == 900.0
    assert data["audit"]["piqa_local@0shot"]["equal"] is False
    assert data["audit"]["piqa_local@0shot"]["truncated"] == {"learned": 1, "binary": 1}
    md = md_path.read_text()
    assert "evaluation standard errors" in md and "SmolLM2-135M (reference)" in md and "| **NO** |" in md
    assert "0.6250 ± 0.1000" in md
    assert (layout.report_dir / "loss_curves.png").stat().st_size > 0
