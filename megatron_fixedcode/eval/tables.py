"""Reports: one table per model, and a comparison across models and seeds as paper 1 reports it
(across-seed mean and relative seed range ``(max − min) / mean``), with optional reference rows.

A result is the JSON of ``tools/evaluate.py`` (harness or perplexity) plus ``label`` (the
variant, e.g. ``binary``) and ``seed``; references (e.g. SmolLM2-135M under the same protocol)
carry ``"reference": true`` and are listed, never aggregated. Standard errors shown are
evaluation errors of one run, not seed variability.
"""

from __future__ import annotations

from typing import Any

from megatron_fixedcode.eval.audit import differing_request_sets


def _section(result: dict[str, Any]) -> str:
    """Perplexity results: held-out documents, SQuAD gold answers (``--squad``) or SFT responses (``--sft-data``)."""
    return result.get("task", "validation")


def metric_rows(result: dict[str, Any]) -> dict[str, float]:
    """``{"task@Nshot/metric": value}`` (stderr and sample counts dropped); perplexity results
    become ``validation/loss`` and ``validation/ppl``."""
    if "results" not in result:
        return {f"{_section(result)}/{k}": float(result[k]) for k in ("loss", "ppl") if k in result}
    return {
        f"{task}/{metric}": value
        for task, metrics in result["results"].items()
        for metric, value in metrics.items()
        if not metric.endswith("_stderr") and metric != "sample_len"
    }


def seed_summary(values: list[float]) -> dict[str, float]:
    mean = sum(values) / len(values)
    spread = max(values) - min(values)
    return {
        "mean": mean,
        "min": min(values),
        "max": max(values),
        "n": len(values),
        "relative_range": spread / mean if mean else float("nan"),
    }


def compare(results: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"models": {label: {metric: seed_summary}}, "references": {label: {metric: value}},
    "differing_request_sets": {task: {run: sha256}}}`` — the last lists every task whose request
    hash is not the same in all results that carry a request audit (the comparison is not like
    for like there)."""
    by_label: dict[str, list[dict[str, float]]] = {}
    references: dict[str, dict[str, float]] = {}
    for r in results:
        label = r.get("label") or r.get("input_embedding") or r.get("model")
        if r.get("reference"):
            references[label] = metric_rows(r)
        else:
            by_label.setdefault(label, []).append(metric_rows(r))
    models = {}
    for label, runs in by_label.items():
        metrics = sorted(set().union(*runs))
        models[label] = {m: seed_summary([run[m] for run in runs if m in run]) for m in metrics}
    return {"models": models, "references": references, "differing_request_sets": differing_request_sets(results)}


def _fmt(value: float) -> str:
    return f"{value:.4f}" if abs(value) < 1000 else f"{value:.4g}"


def model_markdown(result: dict[str, Any]) -> str:
    """One model: task, metric, value ± stderr."""
    lines = [
        f"### {result.get('label') or result.get('model')}",
        "",
        "| task | metric | value | stderr |",
        "|---|---|---|---|",
    ]
    if "results" not in result:
        lines += [f"| {_section(result)} | {k} | {_fmt(result[k])} | |" for k in ("loss", "ppl") if k in result]
    else:
        for task, metrics in sorted(result["results"].items()):
            for metric, value in sorted(metrics.items()):
                if metric.endswith("_stderr") or metric == "sample_len":
                    continue
                err = metrics.get(f"{metric}_stderr")
                lines.append(f"| {task} | {metric} | {_fmt(value)} | {_fmt(err) if err is not None else ''} |")
    if result.get("requests"):
        lines += ["", "| task | requests | truncated to context | request set sha256 |", "|---|---|---|---|"]
        for task, audit in sorted(result["requests"].items()):
            lines.append(
                f"| {task} | {audit['requests']} | {audit['truncated']} (context {audit['max_length']}) | "
                f"{audit['sha256'][:16]} |"
            )
    return "\n".join(lines) + "\n"


def comparison_markdown(table: dict[str, Any]) -> str:
    """Metrics as rows; per model ``mean (range r%, n seeds)``; reference models as plain values."""
    models, refs = table["models"], table["references"]
    metrics = sorted(set().union(*[set(m) for m in models.values()], *[set(r) for r in refs.values()]))
    header = ["metric", *models, *[f"{r} (ref)" for r in refs]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for metric in metrics:
        cells = [metric]
        for stats in models.values():
            s = stats.get(metric)
            cells.append("" if s is None else f"{_fmt(s['mean'])} (range {100 * s['relative_range']:.1f}%, n={s['n']})")
        cells += [_fmt(r[metric]) if metric in r else "" for r in refs.values()]
        lines.append("| " + " | ".join(cells) + " |")
    differing = table.get("differing_request_sets") or {}
    if differing:
        lines += ["", "**Request sets differ** (these rows do not compare like for like):"]
        for task, hashes in sorted(differing.items()):
            lines.append(f"* {task}: " + ", ".join(f"{run} {h[:16] if h else 'absent'}" for run, h in hashes.items()))
    return "\n".join(lines) + "\n"
