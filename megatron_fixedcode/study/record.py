"""The study record: for every run, what makes its numbers comparable with the others'.

One JSON per run (``records/<variant>.json``), written after its evaluation, from the files the
run left (the checkpoint's trainer state, the data manifest, the evaluation result), never from
what the study *meant* to run:

* ``recipe``, ``run_config`` (the resolved trainer flags as the checkpoint saved them) and
  ``config_hash`` (sha256 of ``run_config``);
* ``data_manifest_fingerprint`` (sha256 of the manifests the run trained on, its --data-manifest) and
  ``tokenizer_fingerprint`` (the trainer's, saved in the checkpoint identity);
* ``tokens`` and ``step``: the realized budget, read from the checkpoint counters (paper 2 counts
  processed prediction targets), beside ``planned_steps``;
* ``eval_protocol`` and ``eval_protocol_hash``: tasks, shots, limit, lm-eval version and the task
  files' hashes.

:func:`check_comparable` is the report's gate: runs whose data, tokenizer or protocol differ are
refused, naming the field.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from megatron_fixedcode.utils.files import file_sha256

# The fields that must be equal for runs to stand side by side in one table.
COMPARED_FIELDS = ("data_manifest_fingerprint", "tokenizer_fingerprint", "eval_protocol_hash")


def sha256_json(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write then rename: a killed job leaves no half-written output that looks finished."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def eval_protocol(tasks: str, limit: float | None, tasks_dir: str | Path | None = None) -> dict[str, Any]:
    """What fixes the evaluation: the same dict for every model of a study (hashed in the record)."""
    try:
        import importlib.metadata as md

        lm_eval_version = md.version("lm_eval")
    except Exception:  # noqa: BLE001 - not installed: recorded as such
        lm_eval_version = None
    files = {}
    if tasks_dir and Path(tasks_dir).is_dir():
        files = {p.name: file_sha256(p) for p in sorted(Path(tasks_dir).iterdir()) if p.suffix in (".yaml", ".py")}
    return {
        "tasks": tasks,
        "limit": limit,
        "lm_eval": lm_eval_version,
        "task_files": files,
        "chat_template": False,
        "add_bos_token": False,
        "prefix_token": "eod",
    }


def training_state(ckpt_dir: str | Path) -> dict | None:
    """The trainer state of the latest complete checkpoint (None: none yet)."""
    from megatron_fixedcode import checkpoint

    if not (Path(ckpt_dir) / "latest_checkpointed_iteration.txt").is_file():
        return None
    return checkpoint.read_trainer_state(str(ckpt_dir))


def planned_steps(state: dict) -> int:
    """The run's budget in steps, as the trainer computes it (the first of --train-iters and
    --train-tokens rounded up to a whole step)."""
    cfg = state["run_config"]
    per_step = state["global_batch_size"] * cfg["seq_length"]
    candidates = [
        s
        for s in (cfg.get("train_iters"), -(-cfg["train_tokens"] // per_step) if cfg.get("train_tokens") else None)
        if s
    ]
    return min(candidates)


def training_finished(ckpt_dir: str | Path) -> bool:
    state = training_state(ckpt_dir)
    return state is not None and state["step"] >= planned_steps(state)


def build_record(
    *, variant: str, recipe: str, ckpt_dir: Path, manifest: Path, eval_result: dict, protocol: dict
) -> dict[str, Any]:
    state = training_state(ckpt_dir)
    if state is None:
        raise ValueError(f"{ckpt_dir}: no complete checkpoint; the training of {variant} has not finished")
    run_config = dict(state["run_config"])
    trained_on = run_config.get("data_manifest") or [str(manifest)]  # what the trainer was given
    manifests = [trained_on] if isinstance(trained_on, str) else list(trained_on)
    return {
        "variant": variant,
        "recipe": recipe,
        "run_config": run_config,
        "config_hash": sha256_json(run_config),
        "input_embedding": state["identity"]["input_embedding"],
        "code_fingerprint": state["identity"]["code_fingerprint"],
        "data_manifest": manifests,
        "data_manifest_fingerprint": sha256_json([file_sha256(m) for m in manifests]),
        "data_fingerprint": state.get("data_fingerprint"),
        "tokenizer_fingerprint": state["identity"]["tokenizer_fingerprint"],
        "step": state["step"],
        "planned_steps": planned_steps(state),
        "tokens": state["tokens"],
        "layout": state.get("layout"),
        "eval_protocol": protocol,
        "eval_protocol_hash": sha256_json(protocol),
        "eval_request_sets": {task: a["sha256"] for task, a in (eval_result.get("requests") or {}).items()},
    }


def check_comparable(records: list[dict[str, Any]]) -> None:
    """``ValueError`` naming the first field of :data:`COMPARED_FIELDS` on which the runs differ."""
    for field in COMPARED_FIELDS:
        values = {r["variant"]: r.get(field) for r in records}
        if len(set(values.values())) > 1:
            listed = ", ".join(f"{v} {str(h)[:16]}" for v, h in values.items())
            raise ValueError(
                f"the runs differ in {field} ({listed}): they are not one study; "
                "the report does not put them side by side"
            )


# --- a stage is done when its outputs verify -----------------------------------

RECORD_KEYS = (
    "variant",
    "run_config",
    "config_hash",
    "eval_protocol",
    "eval_protocol_hash",
    "step",
    "tokens",
    "data_manifest_fingerprint",
    "tokenizer_fingerprint",
)


def read_json(path: str | Path) -> Any:
    """The parsed file, or a one-line ``ValueError`` naming it (a half-written or damaged output)."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(
            f"{path}: cannot parse it ({type(e).__name__}: {e}); it is damaged: remove it and "
            "re-run the study to redo the stage that wrote it"
        ) from None


def _parsed(path: Path) -> tuple[Any, str | None]:
    try:
        return read_json(path), None
    except ValueError as e:
        return None, str(e).split("; it is damaged")[0]


def eval_result_problem(path: str | Path) -> str | None:
    """Why ``eval/<v>.json`` is not a finished evaluation (None: it is)."""
    result, problem = _parsed(Path(path))
    if problem:
        return problem
    if not isinstance(result, dict) or not isinstance(result.get("results"), dict):
        return f"{path}: no 'results' in it (not a finished evaluation)"
    return None


def record_problem(path: str | Path, result_path: str | Path | None = None) -> str | None:
    """Why ``records/<v>.json`` does not verify (None: it does): it must parse, hold every field,
    carry the hashes it claims (``config_hash`` of its ``run_config``, ``eval_protocol_hash`` of its
    ``eval_protocol``) and, beside its evaluation result, that result's protocol and request sets."""
    record, problem = _parsed(Path(path))
    if problem:
        return problem
    if not isinstance(record, dict):
        return f"{path}: not a study record (a JSON object)"
    missing = [k for k in RECORD_KEYS if k not in record]
    if missing:
        return f"{path}: no {', '.join(missing)} in it (not a complete study record)"
    for field, of in (("config_hash", "run_config"), ("eval_protocol_hash", "eval_protocol")):
        if record[field] != sha256_json(record[of]):
            return f"{path}: {field} {str(record[field])[:16]} is not the sha256 of its {of} ({sha256_json(record[of])[:16]})"
    if result_path is not None and Path(result_path).is_file():
        result, problem = _parsed(Path(result_path))
        if problem or not isinstance(result, dict):
            return problem or f"{result_path}: not an evaluation result"
        if "eval_protocol" in result and sha256_json(result["eval_protocol"]) != record["eval_protocol_hash"]:
            return f"{path}: eval_protocol_hash differs from that of {result_path}'s protocol"
        sets = {task: a.get("sha256") for task, a in (result.get("requests") or {}).items() if isinstance(a, dict)}
        if record.get("eval_request_sets", sets) != sets:
            return f"{path}: eval_request_sets differ from the request sets of {result_path}"
    return None


def eval_stage_state(result_path: Path, record_path: Path) -> tuple[bool, str | None]:
    """(done, why not where an output is there but does not verify) of a study's eval stage."""
    if not (result_path.is_file() and record_path.is_file()):
        return False, None
    problem = eval_result_problem(result_path) or record_problem(record_path, result_path)
    return problem is None, problem


def export_stage_state(out: Path) -> tuple[bool, str | None]:
    """(done, problem) of an export: its config.json parses (the eval stage's reader checks the
    weight files) and it is not marked incomplete."""
    if not (out / "config.json").is_file():
        return False, None
    config, problem = _parsed(out / "config.json")
    if problem or not isinstance(config, dict):
        return False, problem or f"{out / 'config.json'}: not a JSON object"
    if (out / "EXPORT_INCOMPLETE").exists():
        return False, f"{out}: marked EXPORT_INCOMPLETE (its writer stopped before finishing)"
    return True, None


def report_stage_state(report_json: Path, variants: list[str]) -> tuple[bool, str | None]:
    """(done, problem) of the report: ``report.json`` parses and covers exactly ``variants``."""
    if not report_json.is_file():
        return False, None
    data, problem = _parsed(report_json)
    if problem:
        return False, problem
    runs = data.get("runs") if isinstance(data, dict) else None
    return isinstance(runs, dict) and sorted(runs) == sorted(variants), None
