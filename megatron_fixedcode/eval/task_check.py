"""Whether an lm-eval task list can run here, checked before a training run that evaluates its checkpoints
starts: the local-file tasks (``examples/eval``) and their data files cheaply, from the task files; a name
that is not one of them through lm-eval's own task index (seconds: only then)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from megatron_fixedcode.eval.harness import LOCAL_TASKS_DIR, local_tasks, parse_tasks


def _local_data_module(tasks_dir: Path):
    spec = importlib.util.spec_from_file_location("mfc_local_data", Path(tasks_dir) / "local_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check_local(name: str, local: dict, flag: str, tasks_dir: Path) -> list[str]:
    """The names in ``name`` (a group: its members) that are not local tasks; raises for missing data files."""
    entry = local[name]
    if "members" in entry:
        return [n for m in entry["members"] for n in (_check_local(m, local, flag, tasks_dir) if m in local else [m])]
    if entry["dataset"]:
        data = _local_data_module(tasks_dir)
        try:
            root = data.data_root()
        except ValueError as e:
            raise ValueError(f"{flag} {name}: {e}") from None
        for rel in data.DATA_FILES.get(entry["dataset"], ()):
            if not (root / rel).is_file():
                raise ValueError(f"{flag} {name}: {root / rel} not found (the task's data file under MFC_SHARED_DATA)")
    return []


def check_tasks(spec: str, flag: str, tasks_dir: Path = LOCAL_TASKS_DIR, index_others: bool = True) -> None:
    """Raise ``ValueError`` naming ``flag`` for a malformed list, a missing lm-eval, missing task files or data,
    or an unknown task. Groups of lm-eval's own tasks (``paper``) are not resolved: they download their data."""
    try:
        runs = parse_tasks(spec)
    except ValueError:
        raise ValueError(f"{flag} {spec!r}: expected 'local', 'paper' or task[:num_fewshot],...") from None
    if importlib.util.find_spec("lm_eval") is None:
        raise ValueError(f"{flag} needs the LM Evaluation Harness: pip install 'megatron-fixedcode[eval]'")
    if not any(Path(tasks_dir).glob("*.yaml")) or not (Path(tasks_dir) / "local_data.py").is_file():
        raise ValueError(f"{flag}: the local task files are missing from {tasks_dir} (a broken install)")
    local = local_tasks(tasks_dir)
    others = [name for name, _ in runs if name not in local]
    for name, _ in runs:
        if name in local:
            _check_local(name, local, flag, tasks_dir)
    if others and index_others:
        from lm_eval.tasks import TaskManager

        known = set(TaskManager(include_path=str(tasks_dir)).all_tasks)
        unknown = [n for n in others if n not in known]
        if unknown:
            raise ValueError(
                f"{flag}: unknown lm-eval task {unknown[0]!r} (the local tasks: "
                f"{', '.join(sorted(local))}; else one of lm-eval's task names)"
            )
