"""What the study's jobs run after training (``python -m megatron_fixedcode.study.stages STAGE``):

* ``export``: the final checkpoint -> ``exports/<v>`` (written beside, then renamed: a killed job
  leaves no directory that looks finished);
* ``eval``: the LM Evaluation Harness on the export with the study's protocol -> ``eval/<v>.json``,
  then the study record ``records/<v>.json``;
* ``report``: ``report/report.{md,json}`` and ``report/loss_curves.png`` from the records.
Each refuses to overwrite a finished output.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from megatron_fixedcode.arguments.user_errors import ArgumentParser, user_errors
from megatron_fixedcode.study.graph import load_options
from megatron_fixedcode.study.layout import StudyLayout
from megatron_fixedcode.study.record import (
    build_record,
    eval_protocol,
    eval_result_problem,
    export_stage_state,
    read_json,
    record_problem,
    training_finished,
    write_json_atomic,
)


def _finished_training(layout: StudyLayout, variant: str) -> Path:
    ckpt = layout.checkpoints(variant)
    if not training_finished(ckpt):
        raise ValueError(f"{ckpt}: the training of {variant} has not reached its budget; resubmit the study")
    return ckpt


def export(layout: StudyLayout, variant: str) -> None:
    from megatron_fixedcode.export import convert_checkpoint_to_hf

    out = layout.export(variant)
    done, problem = export_stage_state(out)
    if done:
        print(f"{out}: already exported")
        return
    if problem:  # there but damaged: not a finished export
        print(f"{problem}: exporting {variant} again")
        shutil.rmtree(out)
    ckpt = _finished_training(layout, variant)
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    convert_checkpoint_to_hf(ckpt, partial, overwrite=True)
    partial.replace(out)
    print(f"exported {ckpt} -> {out}")


def evaluate(layout: StudyLayout, variant: str) -> None:
    from megatron_fixedcode.eval.harness import LOCAL_TASKS_DIR, run_harness

    opts = load_options(layout.root)
    result_path, record_path = layout.eval_result(variant), layout.record(variant)
    protocol = eval_protocol(opts.eval_tasks, opts.eval_limit, LOCAL_TASKS_DIR)
    problem = eval_result_problem(result_path) if result_path.is_file() else None
    if problem:
        print(f"{problem}: evaluating {variant} again")
    if result_path.is_file() and not problem:
        result = read_json(result_path)
        print(f"{result_path}: already evaluated")
    else:
        limit = int(opts.eval_limit) if opts.eval_limit and opts.eval_limit >= 1 else opts.eval_limit
        # tools/evaluate.py's path and defaults: the GPU when torch sees one, float32
        result = run_harness(layout.export(variant), opts.eval_tasks, limit=limit, batch_size=opts.eval_batch_size)
        result.update(label=variant, eval_protocol=protocol)
        write_json_atomic(result_path, result)
        print(f"evaluated {layout.export(variant)} -> {result_path}")
    problem = record_problem(record_path, result_path) if record_path.is_file() else None
    if problem:  # a record counts only when it parses and carries the hashes it claims
        print(f"{problem}: writing the study record of {variant} again")
    if problem or not record_path.is_file():
        record = build_record(
            variant=variant,
            recipe=opts.recipe_of(variant),
            ckpt_dir=layout.checkpoints(variant),
            manifest=layout.manifest,
            eval_result=result,
            protocol=protocol,
        )
        write_json_atomic(record_path, record)
        print(f"study record -> {record_path}")


def report(layout: StudyLayout) -> None:
    from megatron_fixedcode.study.report import write_report

    opts = load_options(layout.root)
    out = write_report(layout, opts.variants, opts.references)
    print(f"report -> {out}")


@user_errors
def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stage", choices=("export", "eval", "report"))
    p.add_argument("--study-dir", required=True)
    p.add_argument("--variant", default=None)
    a = p.parse_args(argv)
    layout = StudyLayout(Path(a.study_dir))
    if a.stage != "report" and not a.variant:
        p.error(f"{a.stage} needs --variant")
    if a.stage == "export":
        export(layout, a.variant)
    elif a.stage == "eval":
        evaluate(layout, a.variant)
    else:
        report(layout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
