"""Paper 2's table from a study directory: one column per run (value ± evaluation standard
error), reference columns from their own result files, the realized budgets, the request audit
and the loss curves. Refuses runs that are not one study (:func:`record.check_comparable`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from megatron_fixedcode.eval.audit import differing_request_sets
from megatron_fixedcode.study.layout import StudyLayout
from megatron_fixedcode.study.record import check_comparable, read_json, write_json_atomic

STDERR_NOTE = (
    "± values are evaluation standard errors of one run (lm-eval's stderr over the examples), "
    "not seed variability: each variant is one training run."
)


def table(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """``{"task/metric": {run: {"value": v, "stderr": e}}}``; acc and acc_norm are separate rows,
    perplexities (LAMBADA ``perplexity``, WikiText ``word_perplexity`` ...) rows of their own."""
    rows: dict[str, dict[str, dict[str, float]]] = {}
    for run, result in results.items():
        for task, metrics in (result.get("results") or {}).items():
            for metric, value in metrics.items():
                if metric.endswith("_stderr") or metric == "sample_len":
                    continue
                cell = {"value": value}
                if metrics.get(f"{metric}_stderr") is not None:
                    cell["stderr"] = metrics[f"{metric}_stderr"]
                rows.setdefault(f"{task}/{metric}", {})[run] = cell
    return dict(sorted(rows.items()))


def audit(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per task: requests, truncated per run, and whether the request-set hashes are equal."""
    tasks = sorted(set().union(*[set(r.get("requests") or {}) for r in results.values()]))
    out = {}
    for task in tasks:
        per = {run: (r.get("requests") or {}).get(task) for run, r in results.items()}
        hashes = {run: a["sha256"] if a else None for run, a in per.items()}
        out[task] = {
            "requests": {run: a["requests"] if a else None for run, a in per.items()},
            "truncated": {run: a["truncated"] if a else None for run, a in per.items()},
            "sha256": hashes,
            "equal": len(set(hashes.values())) == 1,
        }
    return out


def _fmt(x: float) -> str:
    return f"{x:.4f}" if abs(x) < 1000 else f"{x:.4g}"


def markdown(data: dict[str, Any]) -> str:
    runs, refs = list(data["runs"]), list(data["references"])
    lines = ["# Paper-2 study report", "", STDERR_NOTE]
    if refs:
        differ = data["reference_request_sets_differ"]
        lines.append(
            "Columns marked (reference) are other models' result files evaluated with the same protocol: "
            "references, not controls." + (f" Their request sets differ on: {', '.join(differ)}." if differ else "")
        )
    lines += [
        "",
        "## Runs",
        "",
        "| run | recipe | input | steps | prediction targets (checkpoint counter) | config sha256 |",
        "|---|---|---|---|---|---|",
    ]
    for run, rec in data["runs"].items():
        lines.append(
            f"| {run} | {rec['recipe']} | {rec['input_embedding']} | {rec['step']} / {rec['planned_steps']} | "
            f"{rec['tokens']:,} | {rec['config_hash'][:16]} |"
        )
    common = data["common"]
    lines += [
        "",
        f"Data manifest sha256 `{common['data_manifest_fingerprint'][:16]}`, tokenizer "
        f"`{common['tokenizer_fingerprint']}`, evaluation protocol sha256 `{common['eval_protocol_hash'][:16]}` "
        "— equal for every run (checked).",
        "",
        "## Evaluation",
        "",
    ]
    header = ["task / metric", *runs, *[f"{r} (reference)" for r in refs]]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row, cells in data["table"].items():
        out = [row]
        for run in runs + refs:
            c = cells.get(run)
            out.append("" if c is None else _fmt(c["value"]) + (f" ± {_fmt(c['stderr'])}" if "stderr" in c else ""))
        lines.append("| " + " | ".join(out) + " |")
    lines += [
        "",
        "## Request audit",
        "",
        "| task | requests | truncated to the context | request sets equal |",
        "|---|---|---|---|",
    ]
    for task, a in data["audit"].items():
        trunc = ", ".join(f"{r} {n}" for r, n in a["truncated"].items())
        reqs = ", ".join(f"{r} {n}" for r, n in a["requests"].items())
        lines.append(f"| {task} | {reqs} | {trunc} | {'yes' if a['equal'] else '**NO**'} |")
    if data.get("loss_curves"):
        lines += ["", "## Loss curves", "", f"![loss curves]({data['loss_curves']})"]
    if data.get("downstream_curves"):
        lines += [
            "",
            "## Downstream scores during training",
            "",
            "Each checkpoint scored by its own job (--downstream-eval-tasks): downstream.jsonl of each run.",
            "",
            f"![downstream scores]({data['downstream_curves']})",
        ]
    return "\n".join(lines) + "\n"


def plot_losses(curves: dict[str, Path], out: Path) -> Path | None:
    """Training (line) and validation (dots) loss of every run in one plot."""
    from megatron_fixedcode.replication.page import read_curve

    curves = {run: p for run, p in curves.items() if p.is_file()}
    if not curves:
        return None
    from megatron_fixedcode.utils.lazy import require

    require("matplotlib", "plots", "the study report's loss curves").use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for run, path in curves.items():
        steps, loss, val_steps, val_loss = read_curve(path)
        (line,) = ax.plot(steps, loss, lw=0.8, label=f"{run} (train)")
        if val_steps:
            ax.plot(val_steps, val_loss, "o", ms=3, color=line.get_color(), label=f"{run} (valid)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120, metadata={"Software": None})
    plt.close(fig)
    return out


def downstream_curves(paths: dict[str, Path]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """``{"task/metric": {run: [(step, value), ...]}}`` from each run's downstream.jsonl (standard errors and
    sample counts left out); the last record of a step counts."""
    from megatron_fixedcode.eval.checkpoint_scores import read_scores

    curves: dict[str, dict[str, dict[int, float]]] = {}
    for run, path in paths.items():
        for r in read_scores(path):
            for metric, value in (r.get("metrics") or {}).items():
                if not metric.endswith("_stderr") and metric != "sample_len":
                    curves.setdefault(f"{r['task']}/{metric}", {}).setdefault(run, {})[r["step"]] = value
    return {k: {run: sorted(v.items()) for run, v in runs.items()} for k, runs in sorted(curves.items())}


def plot_downstream(paths: dict[str, Path], out: Path) -> Path | None:
    """Score vs step, one panel per task and metric, the runs side by side; None without any scores."""
    curves = downstream_curves({run: p for run, p in paths.items() if p.is_file()})
    if not curves:
        return None
    from megatron_fixedcode.utils.lazy import require

    require("matplotlib", "plots", "the study report's downstream curves").use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(curves))
    rows = -(-len(curves) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.2 * rows), squeeze=False)
    for ax, (name, runs) in zip(axes.flat, curves.items()):
        for run, points in runs.items():
            ax.plot([s for s, _ in points], [v for _, v in points], "o-", ms=3, label=run)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(curves) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(out, dpi=120, metadata={"Software": None})
    plt.close(fig)
    return out


def build(records: dict[str, dict], results: dict[str, dict], references: dict[str, dict]) -> dict[str, Any]:
    check_comparable(list(records.values()))
    first = next(iter(records.values()))
    differing = differing_request_sets([{**r, "label": run} for run, r in {**results, **references}.items()])
    return {
        "runs": records,
        "references": sorted(references),
        "common": {k: first[k] for k in ("data_manifest_fingerprint", "tokenizer_fingerprint", "eval_protocol_hash")},
        "table": table({**results, **references}),
        "audit": audit(results),
        "reference_request_sets_differ": sorted(t for t in differing if any(r in differing[t] for r in references)),
        "note": STDERR_NOTE,
    }


def write_report(layout: StudyLayout, variants: list[str], reference_files: list[str]) -> Path:
    missing = [str(layout.record(v)) for v in variants if not layout.record(v).is_file()]
    if missing:
        raise ValueError(f"no study record for {', '.join(missing)}: the evaluation of that run has not finished")
    records = {v: read_json(layout.record(v)) for v in variants}  # a damaged file: one line naming it
    results = {v: read_json(layout.eval_result(v)) for v in variants}
    references = {}
    for path in reference_files:
        r = read_json(path)
        references[r.get("label") or Path(path).stem] = {**r, "reference": True}
    data = build(records, results, references)
    out = layout.report_dir
    out.mkdir(parents=True, exist_ok=True)
    plot = plot_losses({v: layout.train_logs(v) / "metrics.jsonl" for v in variants}, out / "loss_curves.png")
    data["loss_curves"] = plot.name if plot else None
    from megatron_fixedcode.eval.checkpoint_scores import JSONL_NAME

    plot = plot_downstream({v: layout.train_logs(v) / JSONL_NAME for v in variants}, out / "downstream_curves.png")
    data["downstream_curves"] = plot.name if plot else None
    (out / "report.md").write_text(markdown(data))
    write_json_atomic(out / "report.json", data)  # last: its presence marks the stage done
    return out / "report.md"
