"""A study stage is done only when its outputs verify — the records parse and carry
the hashes they claim; a corrupt one is named (its path) and redone, and the report job names the
file it cannot parse. It used to count as done because ``records/<v>.json`` existed, and the report
failed with ``Expecting value: line 1 column 54``, naming no file, on every re-run."""

from pathlib import Path

import pytest

from megatron_fixedcode.study import slurm_submit, stages
from megatron_fixedcode.study.graph import StudyOptions, build_graph, format_graph, save_options
from megatron_fixedcode.study.slurm_submit import submit
from megatron_fixedcode.study.layout import StudyLayout
from megatron_fixedcode.study.record import sha256_json, write_json_atomic
from tests.helpers import REPO

PROTOCOL = {"tasks": "local", "limit": 4, "lm_eval": None, "task_files": {}}
RESULT = {
    "results": {"piqa_local@0shot": {"acc": 0.5, "acc_stderr": 0.1}},
    "eval_protocol": PROTOCOL,
    "requests": {"piqa_local@0shot": {"requests": 8, "sha256": "a" * 64, "truncated": 0}},
}


def _record(variant: str) -> dict:
    run_config = {"seq_length": 32, "train_iters": 4, "input_embedding": variant}
    return {
        "variant": variant,
        "recipe": "r.yaml",
        "input_embedding": variant,
        "run_config": run_config,
        "config_hash": sha256_json(run_config),
        "eval_protocol": PROTOCOL,
        "eval_protocol_hash": sha256_json(PROTOCOL),
        "eval_request_sets": {"piqa_local@0shot": "a" * 64},
        "step": 4,
        "planned_steps": 4,
        "tokens": 1024,
        "data_manifest_fingerprint": "d" * 64,
        "tokenizer_fingerprint": "t" * 16,
    }


def _study(tmp_path: Path) -> tuple[StudyOptions, StudyLayout]:
    opts = StudyOptions(
        study_dir=str(tmp_path),
        mfc_root=str(REPO),
        variants=["learned", "binary"],
        stages=["eval", "report"],
        eval_tasks="local",
        eval_limit=4,
    )
    save_options(opts)
    layout = StudyLayout(tmp_path)
    for v in opts.variants:
        write_json_atomic(layout.eval_result(v), RESULT)
        write_json_atomic(layout.record(v), _record(v))
    return opts, layout


def _eval_job(opts, variant):
    return next(j for j in build_graph(opts) if j.name == f"eval-{variant}")


@pytest.mark.parametrize(
    "damage, why",
    [
        (
            lambda p: p.write_text('{"variant": "binary", "recipe": "r.yaml", "run_config": {"seq_length": 3'),
            "cannot parse it",
        ),
        (lambda p: p.write_text(p.read_text().replace('"train_iters": 4', '"train_iters": 5')), "config_hash"),
        (lambda p: p.write_text(p.read_text().replace('"limit": 4', '"limit": 8')), "eval_protocol_hash"),
        (lambda p: p.write_text(p.read_text().replace('"tokens": 1024,', "")), "no tokens"),
    ],
    ids=["garbage", "config-hash", "protocol-hash", "missing-field"],
)
def test_a_corrupt_record_is_named_and_the_stage_is_redone(tmp_path, monkeypatch, damage, why):
    opts, layout = _study(tmp_path)
    assert _eval_job(opts, "binary").done
    damage(layout.record("binary"))
    job = _eval_job(opts, "binary")
    assert not job.done and str(layout.record("binary")) in job.problem and why in job.problem, job.problem
    assert _eval_job(opts, "learned").done
    assert f"(redo: {layout.record('binary')}" in format_graph(build_graph(opts))
    logged: list[str] = []
    monkeypatch.setattr(slurm_submit, "_sbatch", lambda args: "4242")
    submit(opts, [job], log=logged.append)
    assert logged[0].startswith(f"eval-binary: {layout.record('binary')}") and logged[0].endswith("redoing it"), logged


def test_the_report_names_the_file_it_cannot_parse(tmp_path):
    from megatron_fixedcode.study.report import write_report

    opts, layout = _study(tmp_path)
    layout.record("binary").write_text('{"variant": "binary", "recipe": "r.yaml", "run_config": garbage}')
    with pytest.raises(ValueError, match=rf"^{layout.record('binary')}: cannot parse it .*Expecting value"):
        write_report(layout, opts.variants, [])
    assert not (layout.report_dir / "report.json").exists()


def test_a_damaged_report_json_is_not_done(tmp_path):
    opts, layout = _study(tmp_path)
    layout.report_dir.mkdir()
    (layout.report_dir / "report.json").write_text('{"runs": ')
    job = next(j for j in build_graph(opts) if j.name == "report")
    assert not job.done and str(layout.report_dir / "report.json") in job.problem


def test_the_eval_stage_rewrites_a_corrupt_record(tmp_path, monkeypatch, capsys):
    from megatron_fixedcode.eval import harness

    opts, layout = _study(tmp_path)
    layout.record("binary").write_text("garbage")
    monkeypatch.setattr(harness, "run_harness", lambda *a, **k: pytest.fail("the result verifies: not re-evaluated"))
    monkeypatch.setattr(stages, "build_record", lambda **k: _record("binary"))
    stages.evaluate(layout, "binary")
    out = capsys.readouterr().out
    assert f"{layout.record('binary')}: cannot parse it" in out and "writing the study record of binary again" in out
    assert _eval_job(opts, "binary").done


def test_an_export_with_a_damaged_config_is_named_and_redone(tmp_path):
    opts = StudyOptions(study_dir=str(tmp_path), mfc_root=str(REPO), variants=["binary"], stages=["export"])
    config = StudyLayout(tmp_path).export("binary") / "config.json"
    config.parent.mkdir(parents=True)
    config.write_text('{"architectures": ["LlamaForCausalLM"], "hidden_')
    job = build_graph(opts)[0]
    assert not job.done and str(config) in job.problem and "cannot parse it" in job.problem


def _fake_slurm(bin_dir: Path, **outputs: str) -> None:
    bin_dir.mkdir()
    for name, text in outputs.items():
        (bin_dir / name).write_text(f"#!/bin/sh\nprintf '{text}'\n")
        (bin_dir / name).chmod(0o755)


@pytest.mark.parametrize(
    "sacct, squeue, state",
    [
        ("COMPLETED\\n", "PENDING\\n", "PENDING"),  # slurmdbd has not recorded the array's pending remainder
        ("COMPLETED\\nRUNNING\\n", "", "RUNNING"),
        ("COMPLETED\\nCOMPLETED\\n", "", "COMPLETED"),
        ("FAILED\\nCOMPLETED\\n", "", "FAILED"),
        ("", "PENDING\\n", "PENDING"),  # nothing in the database yet: the controller answers
    ],
)
def test_a_job_done_in_sacct_is_asked_of_the_controller_too(tmp_path, monkeypatch, sacct, squeue, state):
    _fake_slurm(tmp_path / "bin", sacct=sacct, squeue=squeue, scontrol="")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert slurm_submit.slurm_state("276") == state
