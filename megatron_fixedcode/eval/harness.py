"""The LM Evaluation Harness on an exported Hugging Face directory (no chat template).

Two task sets: the papers' suite by lm-eval's own task names (they download their datasets, so
they need the hub or a warm HF cache), and local-file tasks under ``examples/eval/`` that read
the benchmarks in their original formats from the shared data directory (offline machines).
Contexts get no BOS; an empty context is the EOD token (``prefix_token_id``), which for the
canonical and zero-offset GF(2) codes is the zero input vector (docs/evaluation.md).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from megatron_fixedcode.eval.audit import RequestAudit
from megatron_fixedcode.export import hf_io
from megatron_fixedcode.utils.lazy import require

LOCAL_TASKS_DIR = Path(__file__).resolve().parent / "tasks"  # examples/eval, shipped as package data
# (group or task, num_fewshot): paper 2's evaluation table. MMLU runs 0- and 5-shot.
PAPER_SUITE = [("fixedcode_paper_suite", 0), ("mmlu", 5)]
LOCAL_SUITE = [("fixedcode_local", 0)]
SUITES = {"paper": PAPER_SUITE, "local": LOCAL_SUITE}


def parse_tasks(spec: str) -> list[tuple[str, int]]:
    """``"paper"``, ``"local"`` or ``"task[:shots],task[:shots]"``."""
    if spec in SUITES:
        return SUITES[spec]
    runs = []
    for item in spec.split(","):
        name, _, shots = item.strip().partition(":")
        if not name or (shots and not shots.isdigit()):
            raise ValueError(f"--tasks {spec!r}: expected 'paper', 'local' or task[:num_fewshot],...")
        runs.append((name, int(shots or 0)))
    return runs


def local_tasks(tasks_dir: Path = LOCAL_TASKS_DIR) -> dict[str, dict]:
    """``{name: {"members": [...]}}`` for a group, ``{name: {"dataset": function}}`` for a task, read from the
    task files with regular expressions (their ``!function`` tags need lm-eval's YAML loader)."""
    out: dict[str, dict] = {}
    for path in sorted(Path(tasks_dir).glob("*.yaml")):
        text = path.read_text()
        if group := re.search(r"^group:\s*(\S+)", text, re.M):
            block = re.search(r"^task:\s*\n((?:[ \t]+-.*\n?)+)", text, re.M)
            out[group.group(1)] = {"members": re.findall(r"-\s*(\S+)", block.group(1)) if block else []}
        elif task := re.search(r"^task:\s*(\S+)", text, re.M):
            dataset = re.search(r"^custom_dataset:\s*!function\s+local_data\.(\w+)", text, re.M)
            out[task.group(1)] = {"dataset": dataset.group(1) if dataset else None}
    return out


def all_local(spec: str, tasks_dir: Path = LOCAL_TASKS_DIR) -> bool:
    """Every task of ``spec`` is a local-file task (lm-eval need not index its own ~15,000 task files)."""
    local = local_tasks(tasks_dir)

    def is_local(name: str) -> bool:
        return name in local and all(is_local(m) for m in local[name].get("members", []))

    return all(is_local(name) for name, _ in parse_tasks(spec))


def flatten_results(results: dict[str, Any], num_fewshot: int) -> dict[str, dict[str, float]]:
    """``{"task@Nshot": {"acc": .., "acc_stderr": .., "acc_norm": .., ...}}``; acc and acc_norm stay apart."""
    rows = {}
    for task, metrics in results.items():
        row = {}
        for key, value in metrics.items():
            metric, _, filt = key.partition(",")
            if not isinstance(value, (int, float)) or metric == "alias" or filt not in ("none", ""):
                continue
            row[metric] = float(value)
        if row:
            rows[f"{task}@{num_fewshot}shot"] = row
    return rows


def run_harness(
    model_dir: str | Path,
    tasks: str,
    *,
    limit: int | float | None = None,
    batch_size: int = 8,
    device: str | None = None,
    dtype: str = "float32",
    include_path: str | Path | None = LOCAL_TASKS_DIR,
    trust_remote_code: bool = False,
) -> dict[str, Any]:
    """Run every (task, shots) of ``tasks``; returns ``{"model", "results", "config"}``. ``device``:
    default CUDA when torch sees a GPU (:func:`~megatron_fixedcode.eval.perplexity.default_device`);
    ``dtype``: the weights' dtype in the harness (float32, bfloat16 or float16)."""
    from megatron_fixedcode.eval.perplexity import default_device
    from megatron_fixedcode.eval.run import DTYPES

    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    device = device or default_device()
    lm_eval = require("lm_eval", "eval", "evaluate --tasks (the LM Evaluation Harness)")
    from lm_eval.api.registry import get_model
    from lm_eval.tasks import TaskManager

    model_dir = Path(model_dir)
    config = hf_io.read_config(model_dir)
    eod = config.get("eos_token_id")
    model_args = {
        "pretrained": str(model_dir),
        "dtype": dtype,
        "trust_remote_code": trust_remote_code,
        "add_bos_token": False,
    }
    if eod is not None:
        model_args["prefix_token_id"] = eod
    # local-file tasks only: lm-eval need not index its own task files (seconds on every call)
    defaults = not (include_path and all_local(tasks, Path(include_path)))
    manager = TaskManager(include_path=str(include_path) if include_path else None, include_defaults=defaults)
    runs = parse_tasks(tasks)
    lm = get_model("hf").create_from_arg_obj(model_args, {"batch_size": batch_size, "device": device})
    audit = RequestAudit(lm)  # per task: hash of the request set, requests truncated to the context
    rows: dict[str, dict[str, float]] = {}
    requests: dict[str, dict[str, Any]] = {}
    for task, shots in runs:
        audit.reset()
        out = lm_eval.simple_evaluate(
            model=lm,
            tasks=[task],
            num_fewshot=shots,
            limit=limit,
            task_manager=manager,
            apply_chat_template=False,
            random_seed=0,
            numpy_random_seed=0,
            torch_random_seed=0,
            fewshot_random_seed=1234,
            log_samples=False,
        )
        rows.update(flatten_results(out["results"], shots))
        requests.update({f"{name}@{shots}shot": summary for name, summary in audit.summary().items()})
    fixed = config.get("fixed_code")
    return {
        "model": str(model_dir),
        "input_embedding": fixed["input_embedding"] if fixed else "learned",
        "code_fingerprint": fixed["fingerprint"] if fixed else None,
        "provenance": config.get("megatron_fixedcode"),
        "results": rows,
        "requests": requests,
        "config": {
            "tasks": tasks,
            "limit": limit,
            "prefix_token_id": eod,
            "chat_template": False,
            "device": device,
            "dtype": dtype,
            "batch_size": batch_size,
            "bos": "none; empty contexts get the EOD token as prefix",
        },
    }


def save_json(path: str | Path, data: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
