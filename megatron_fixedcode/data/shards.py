"""Shard-parallel, resumable indexing: one ``.bin/.idx`` pair per input shard and split.

A *plan* (``OUTPUT_DIR/plan.json``, written once at submission) fixes the sorted list of input
shards, the preprocessing settings and how shards are grouped into array tasks, so every task of
a Slurm array reads the same list. Task ``i`` indexes its group shard by shard with exactly
:func:`megatron_fixedcode.data.preprocess.preprocess` (outputs byte-identical to
``tools/preprocess_data.py --input SHARD --output-prefix OUTPUT_DIR/NAME``).

The shard's summary ``NAME_summary.json`` is its completion record, written last and atomically:
it adds to the preprocessing summary (which holds each output's ``.bin`` size and sha256 and ``.idx``
sha256) the input's size and mtime and the tokenizer fingerprint. A shard is skipped when that
record matches (input unchanged, same tokenizer and settings, outputs of the recorded ``.bin`` sizes
and ``.idx`` hashes: the ``.bin`` hash is left to ``tools/verify_dataset.py``, as hashing every
``.bin`` at each re-submission would read the whole corpus); anything else is redone, the old
record removed first, so a killed task never leaves a shard that looks complete. A shard whose
input is bad gets ``NAME_failed.json`` (the error, naming file and line) and the task goes on.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from pathlib import Path
from typing import Optional, Sequence

from megatron_fixedcode.data.preprocess import PreprocessConfig, expand_inputs, output_prefix_for, preprocess
from megatron_fixedcode.data.preprocess.inputs import SUFFIXES
from megatron_fixedcode.utils.files import DiskFull, is_disk_full
from megatron_fixedcode.utils.locks import LockHeld

logger = logging.getLogger(__name__)

PLAN_FILE = "plan.json"
SPLIT_SETTINGS = (
    "json_keys",
    "id_key",
    "append_eod",
    "split_sentences",
    "valid_fraction",
    "split_seed",
    "min_doc_tokens",
    "eod_token",
    "max_document_bytes",
    "skip_bad_documents",
)
"""Settings that change the outputs: a shard indexed under other values is redone."""


def shard_name(path: str | Path) -> str:
    name = Path(path).name
    for suffix in sorted(SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _write_json(path: Path, data: dict) -> None:
    """Whole or not at all; a full disk is :class:`DiskFull` naming ``path`` (its old content kept)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        if is_disk_full(e):
            raise DiskFull(
                path, e, f"{path.name} is as it was (a shard without its summary is indexed again)"
            ) from None
        raise


def make_plan(
    inputs: Sequence[str],
    output_dir: str,
    tokenizer_type: str,
    tokenizer_model: Optional[str],
    shards_per_task: Optional[int] = None,
    num_tasks: Optional[int] = None,
    **settings,
) -> dict:
    """Sorted shards, settings and task groups; give ``shards_per_task`` or ``num_tasks``. GPT2BPETokenizer:
    ``tokenizer_model`` None and ``vocab_file``/``merge_file`` in ``settings`` (Megatron-LM's flags)."""
    files = sorted({str(p.resolve()) for p in expand_inputs(inputs)})
    names = [shard_name(f) for f in files]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(
            f"--input: several shards share the name {dupes[0]!r} "
            "(outputs are named by file name); rename them or index them separately"
        )
    if shards_per_task is None:
        num_tasks = max(1, min(num_tasks or len(files), len(files)))
        shards_per_task = math.ceil(len(files) / num_tasks)
    if shards_per_task < 1:
        raise ValueError(f"--shards-per-task must be >= 1, got {shards_per_task}")
    for key in ("vocab_file", "merge_file"):  # array tasks run elsewhere: absolute paths, as for the model
        settings[key] = settings.get(key) and str(Path(settings[key]).resolve())
    cfg = PreprocessConfig(
        input=files,
        output_prefix=str(Path(output_dir) / "x"),
        tokenizer_type=tokenizer_type,
        tokenizer_model=tokenizer_model and str(Path(tokenizer_model).resolve()),
        **settings,
    )  # validates settings
    settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("input", "output_prefix")}
    return {
        "version": 1,
        "output_dir": str(Path(output_dir).resolve()),
        "inputs": files,
        "shards_per_task": shards_per_task,
        "num_tasks": math.ceil(len(files) / shards_per_task),
        "settings": settings,
    }


def plan_tokenizer(plan: dict):
    """The tokenizer a plan's shards are indexed with (its fingerprint marks what is complete)."""
    from megatron_fixedcode.tokenizers import build_tokenizer

    s = plan["settings"]
    return build_tokenizer(s["tokenizer_type"], s["tokenizer_model"], s["eod_token"], s.get("merge_file"))


def write_plan(plan: dict) -> Path:
    out = Path(plan["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / PLAN_FILE, plan)
    return out / PLAN_FILE


def read_plan(output_dir: str | Path) -> dict:
    path = Path(output_dir) / PLAN_FILE if Path(output_dir).is_dir() else Path(output_dir)
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: no readable shard plan ({e}); run the planning step first") from None


def task_inputs(plan: dict, task_id: int) -> list[str]:
    if not 0 <= task_id < plan["num_tasks"]:
        raise ValueError(f"task {task_id} is outside the plan's array 0-{plan['num_tasks'] - 1}")
    k = plan["shards_per_task"]
    return plan["inputs"][task_id * k : (task_id + 1) * k]


def shard_config(plan: dict, input_path: str) -> PreprocessConfig:
    prefix = str(Path(plan["output_dir"]) / shard_name(input_path))
    return PreprocessConfig(input=[input_path], output_prefix=prefix, **plan["settings"])


def _input_record(path: str) -> dict:
    st = os.stat(path)
    return {"input": path, "input_bytes": st.st_size, "input_mtime_ns": st.st_mtime_ns}


def shard_status(plan: dict, input_path: str, tokenizer_fingerprint: str) -> tuple[str, str]:
    """``("done" | "failed" | "missing" | "stale", detail)`` for one shard of the plan."""
    from megatron_fixedcode.utils.files import file_sha256

    out, name = Path(plan["output_dir"]), shard_name(input_path)
    summary_path, failed_path = out / f"{name}_summary.json", out / f"{name}_failed.json"
    current = _input_record(input_path)
    if failed_path.is_file():
        failure = json.loads(failed_path.read_text())
        if (
            all(failure.get(k) == v for k, v in current.items())
            and failure.get("tokenizer_fingerprint") == tokenizer_fingerprint
        ):
            return "failed", failure["error"]
        return "stale", "failed before, the input or tokenizer changed since"
    if not summary_path.is_file():
        return "missing", "not indexed yet"
    try:
        summary = json.loads(summary_path.read_text())
    except json.JSONDecodeError:
        return "stale", "unreadable summary"
    record = summary.get("shard")
    if record is None:
        return "stale", "summary without a shard record (the task was killed while finishing it)"
    for key, value in current.items():
        if record.get(key) != value:
            return "stale", f"input changed since indexing ({key} {record.get(key)} -> {value})"
    if record.get("tokenizer_fingerprint") != tokenizer_fingerprint:
        return (
            "stale",
            f"indexed with tokenizer {record.get('tokenizer_fingerprint')}, the plan's is {tokenizer_fingerprint}",
        )
    if record.get("settings") != {k: plan["settings"][k] for k in SPLIT_SETTINGS}:
        return "stale", "indexed with other settings"
    for base, files in summary.get("outputs_sha256", {}).items():
        prefix = out / base
        if not (Path(f"{prefix}.bin").is_file() and Path(f"{prefix}.idx").is_file()):
            return "stale", f"{prefix}.bin/.idx missing"
        if (
            os.path.getsize(f"{prefix}.bin") != files["bin_bytes"]
            or file_sha256(f"{prefix}.idx") != files["idx_sha256"]
        ):
            return "stale", f"{prefix} differs from what its summary recorded"
    return "done", ""


def index_shard(plan: dict, input_path: str, tokenizer_fingerprint: str) -> dict:
    """Index one shard (not checking whether it is done); returns its summary (whose
    ``outputs_sha256`` preprocessing recorded)."""
    cfg = shard_config(plan, input_path)
    out, name = Path(plan["output_dir"]), shard_name(input_path)
    summary_path, failed_path = out / f"{name}_summary.json", out / f"{name}_failed.json"
    for stale in (summary_path, failed_path):
        stale.unlink(missing_ok=True)  # no old record may vouch for outputs being rewritten
    record = {**_input_record(input_path), "tokenizer_fingerprint": tokenizer_fingerprint}
    try:
        summary = preprocess(cfg)
    except LockHeld:
        raise  # another task is writing this shard right now: nothing is wrong with the input
    except ValueError as e:
        _write_json(failed_path, {**record, "error": str(e)})
        raise
    summary["shard"] = {**record, "name": name, "settings": {k: plan["settings"][k] for k in SPLIT_SETTINGS}}
    _write_json(summary_path, summary)  # the completion record, last
    return summary


def run_task(plan: dict, task_id: int) -> dict:
    """Index this task's shards that are not done (a failed one is tried again: the failure
    may have been transient); a bad input is recorded and the task goes on.

    Returns ``{"done": [...], "skipped": [...], "busy": [...], "failed": {name: error}}``; a
    shard another live task holds the lock of (an overlapping re-submission) is ``busy``.
    """
    fingerprint = plan_tokenizer(plan).fingerprint
    report = {"done": [], "skipped": [], "busy": [], "failed": {}}
    for path in task_inputs(plan, task_id):
        name = shard_name(path)
        status, detail = shard_status(plan, path, fingerprint)
        if status == "done":
            logger.info("shard %s: complete and matching its input, skipped", name)
            report["skipped"].append(name)
            continue
        logger.info("shard %s: indexing (%s)", name, detail)
        try:
            index_shard(plan, path, fingerprint)
        except LockHeld as e:
            logger.warning("shard %s: being written by another task, left to it (%s)", name, e)
            report["busy"].append(name)
            continue
        except ValueError as e:
            logger.error("shard %s failed: %s", name, e)
            report["failed"][name] = str(e)
            continue
        report["done"].append(name)
    return report


def plan_status(plan: dict, tokenizer_fingerprint: str) -> dict[str, tuple[str, str]]:
    return {shard_name(p): shard_status(plan, p, tokenizer_fingerprint) for p in plan["inputs"]}


def tasks_to_run(plan: dict) -> list[int]:
    """The array tasks with a shard that is not done (missing, stale or failed): a re-submission runs only these."""
    fingerprint = plan_tokenizer(plan).fingerprint
    status = plan_status(plan, fingerprint)
    return [
        i for i in range(plan["num_tasks"]) if any(status[shard_name(p)][0] != "done" for p in task_inputs(plan, i))
    ]


def array_spec(tasks: Sequence[int]) -> str:
    """Slurm's --array list of task ids: [0, 1, 2, 5] -> "0-2,5"."""
    runs: list[list[int]] = []
    for t in sorted(tasks):
        if runs and t == runs[-1][1] + 1:
            runs[-1][1] = t
        else:
            runs.append([t, t])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


def shard_prefixes(plan: dict, input_path: str) -> dict[str, str]:
    """Output prefix per split of the first json key."""
    cfg = shard_config(plan, input_path)
    return {split: output_prefix_for(cfg.output_prefix, split, cfg.json_keys[0]) for split in cfg.splits}
