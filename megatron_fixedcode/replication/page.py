"""docs/REPLICATION.md from the run records alone: paper 1's table format (per seed, mean, relative
seed range), each variant's min–max seed range and its mean's difference from learned's in percent,
loss curves, model readings. Every number on the page is read from a committed JSON (or the study's
recipe), so re-running the report changes nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from megatron_fixedcode.eval.tables import seed_summary
from megatron_fixedcode.replication.study import MAIN_VARIANTS, VARIANTS, Run, StudyPlan

READING_FILE = "reading.md"  # hand-written, beside the records; included verbatim
# Perplexities are printed to 0.1: finer than any seed range here, and what a rerun on another
# machine of the same kind reproduces (--verify compares at this precision).
PPL = ".1f"


def read_curve(path: Path) -> tuple[list[int], list[float], list[int], list[float]]:
    """Training and held-out loss by step from a trainer metrics file; a resumed run logs some
    steps twice, the later line wins."""
    train, val = {}, {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        train[r["step"]] = r["loss"]
        if "val_loss" in r:
            val[r["step"]] = r["val_loss"]
    return sorted(train), [train[s] for s in sorted(train)], sorted(val), [val[s] for s in sorted(val)]


def variant_table(records: dict[Run, dict]) -> dict[str, dict]:
    """variant -> {"seeds", "val_ppl", "summary"} in the order of VARIANTS."""
    table = {}
    for variant in VARIANTS:
        runs = sorted((r for r in records if r.variant == variant), key=lambda r: r.seed)
        if runs:
            ppl = [records[r]["val_ppl"] for r in runs]
            table[variant] = {"seeds": [r.seed for r in runs], "val_ppl": ppl, "summary": seed_summary(ppl)}
    return table


def gap_percent(table: dict[str, dict], variant: str, reference: str = "learned") -> float | None:
    """100 · (mean PPL of ``variant`` − mean of ``reference``) / mean of ``reference``. A percent of
    the operating point, to set beside each variant's own relative seed range; not a count of one
    variant's (here the narrowest) seed range, which made small gaps look large."""
    ref = table.get(reference)
    if ref is None or variant not in table:
        return None
    return 100 * (table[variant]["summary"]["mean"] - ref["summary"]["mean"]) / ref["summary"]["mean"]


def plot_curves(records: dict[Run, dict], out: Path) -> Path:
    """Two panels side by side: the main variants (every seed) and the controls next to learned and
    binary at the first seed. Training loss as lines, held-out loss as dots."""
    from megatron_fixedcode.utils.lazy import require

    require("matplotlib", "plots", "the replication report's loss curves").use("Agg")
    import matplotlib.pyplot as plt

    first_seed = min(r.seed for r in records)
    panels = [
        ("learned, binary, gf2: every seed", [r for r in records if r.variant in MAIN_VARIANTS]),
        (
            f"controls (seed {first_seed}) beside learned and binary",
            [r for r in records if r.seed == first_seed and r.variant not in ("gf2",)],
        ),
    ]
    colors = {v: f"C{i % 10}" for i, v in enumerate(VARIANTS)}
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    lo = min(min(rec["curve"]["loss"]) for rec in records.values())
    for ax, (title, runs) in zip(axes, panels):
        labelled = set()
        for run in sorted(runs, key=lambda r: (list(VARIANTS).index(r.variant), r.seed)):
            c = records[run]["curve"]
            label = None if run.variant in labelled else run.variant
            labelled.add(run.variant)
            ax.plot(c["step"], c["loss"], color=colors[run.variant], lw=0.8, alpha=0.6, label=label)
            ax.plot(c["val_step"], c["val_loss"], "o", color=colors[run.variant], ms=2.5)
        ax.set(xlabel="optimizer step", title=title, ylim=(lo - 0.1, lo + 2.5))
        if runs:
            ax.legend(fontsize=7)
    axes[0].set_ylabel("loss (nats / token): training (lines), held-out (dots)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def _fmt(x: float | None, spec: str, none: str = "n/a") -> str:
    return none if x is None else format(x, spec)


def ppl_table(table: dict[str, dict], seeds: list[int]) -> list[str]:
    head = " | ".join(f"seed {s}" for s in seeds)
    lines = [
        f"| input | {head} | mean | seed range (min – max) | rel. seed range | mean vs learned's mean | controls for |",
        "|---|" + "---|" * (len(seeds) + 5),
    ]
    for variant, t in table.items():
        by_seed = dict(zip(t["seeds"], t["val_ppl"]))
        cells = [_fmt(by_seed.get(s), PPL, "–") for s in seeds]
        several = len(t["seeds"]) > 1
        spread = f"{t['summary']['min']:{PPL}} – {t['summary']['max']:{PPL}}" if several else "n/a (1 seed)"
        rel = f"{100 * t['summary']['relative_range']:.2f}%" if several else "n/a"
        gap = "–" if variant == "learned" else _fmt(gap_percent(table, variant), "+.1f") + "%"
        lines.append(
            f"| {variant} | {' | '.join(cells)} | {t['summary']['mean']:{PPL}} | {spread} | {rel} | {gap} | "
            f"{VARIANTS[variant][1]} |"
        )
    return lines


def readings_tables(records: dict[Run, dict]) -> list[str]:
    analysed = [(r, rec["readings"]) for r, rec in records.items() if rec.get("readings")]
    if not analysed:
        return ["No analysed run has finished yet."]
    sites = analysed[0][1]["sites"]
    lines = [
        "Mean L2 norm of the residual stream at each site (held-out windows):",
        "",
        "| run | " + " | ".join(sites) + " | growth (last / input) |",
        "|---|" + "---|" * (len(sites) + 1),
    ]
    for run, rd in analysed:
        norms = rd["mean_norm"]
        lines.append(f"| {run.name} | " + " | ".join(f"{n:.1f}" for n in norms) + f" | {norms[-1] / norms[0]:.1f}× |")
    lines += [
        "",
        "Mean cosine between residual vectors at random position pairs (1 = one shared direction):",
        "",
        "| run | " + " | ".join(sites) + " |",
        "|---|" + "---|" * len(sites),
    ]
    for run, rd in analysed:
        lines.append(f"| {run.name} | " + " | ".join(f"{c:.2f}" for c in rd["mean_cosine"]) + " |")
    blocks = len(analysed[0][1]["ablation_delta"])
    lines += [
        "",
        "Loss increase (nats/token) when one block is skipped:",
        "",
        "| run | intact loss | " + " | ".join(f"block {i}" for i in range(blocks)) + " |",
        "|---|---|" + "---|" * blocks,
    ]
    for run, rd in analysed:
        lines.append(
            f"| {run.name} | {rd['ablation_loss']:.3f} | "
            + " | ".join(f"{d:+.3f}" for d in rd["ablation_delta"])
            + " |"
        )
    return lines


def proportions(plan: StudyPlan, records: dict[Run, dict]) -> str:
    """d/K and the learned table's share of parameters here, beside the papers' (K = 16; d = 1024 in
    paper 1, 2048 in paper 2)."""
    r = yaml.safe_load(plan.recipe.read_text())
    k = (plan.vocab_size - 1).bit_length()
    share = [rec["parameters"] for run, rec in records.items() if run.variant == "learned"]
    table = (
        f"; the learned table's share of parameters {plan.vocab_size * r['hidden_size'] / share[0]:.1%}"
        if share
        else ""
    )
    return f"d/K = {r['hidden_size'] / k:.0f}, papers 64 and 128{table}, papers ~12% and ~5.5%"


def setup_text(plan: StudyPlan, records: dict[Run, dict], data: dict) -> str:
    r = yaml.safe_load(plan.recipe.read_text())
    k = (plan.vocab_size - 1).bit_length()
    d, seq, gbs = r["hidden_size"], r["seq_length"], r["global_batch_size"]
    targets = plan.train_iters * gbs * seq
    params = {run.variant: rec["parameters"] for run, rec in records.items()}
    table_share = (
        f"{plan.vocab_size * d / params['learned']:.1%} of the learned model's {params['learned']:,} parameters"
        if "learned" in params
        else ""
    )
    speed = sorted(rec["tokens_per_second"] for rec in records.values())
    counts = sorted({rec["val_tokens"] for rec in records.values() if "val_tokens" in rec})
    scored = (
        "every record has " + f"{counts[0]:,}"
        if len(counts) == 1
        else "records differ: " + ", ".join(f"{c:,}" for c in counts)
        if counts
        else "no record yet"
    )
    measured = (
        f"Measured: {speed[len(speed) // 2]:,} tokens/s per run (median of {len(speed)} runs, one "
        f"single-threaded process each, {len(speed) and min(speed):,}–{max(speed):,}), i.e. "
        f"~{targets / speed[len(speed) // 2] / 60:.0f} min per run and "
        f"~{len(plan.runs) * targets / speed[len(speed) // 2] / 3600 / 2:.1f} h for the {len(plan.runs)} runs "
        f"two at a time."
        if speed
        else ""
    )
    return (
        f"**Data.** {plan.corpus_mb:g} MB of the shared English corpus (Gutenberg books without license text, State of "
        f"the Union speeches, WikiText-2 valid) as ~4,000-character paragraph-aligned documents, split train/held-out by "
        f"a seeded hash of the document id (5%): {data['documents']['train']:,} / {data['documents']['valid']:,} "
        f"documents, {data['tokens']['train']:,} / {data['tokens']['valid']:,} tokens. Tokenizer: byte-level BPE, "
        f"V = {plan.vocab_size:,} (K = {k}), trained on the train documents only. Data fingerprint "
        f"`{data['fingerprint']}` (tokenizer and indexed files by content).\n\n"
        f"**Model.** Paper-2 block (RMSNorm, SwiGLU, RoPE, no biases, untied head), {r['num_layers']} layers × "
        f"{d} (d/K = {d / k:.0f} tiles), {r['num_attention_heads']} heads, FFN {r['ffn_hidden_size']}, context {seq}, "
        f"FP32, megatron-core local layers on CPU. The learned input table is {plan.vocab_size:,} × {d} = "
        f"{plan.vocab_size * d:,} parameters{', ' + table_share if table_share else ''} (paper 1: ~12%, paper 2: "
        f"~5.5%; d/K is 64 in paper 1 and 128 in paper 2).\n\n"
        f"**Training.** Megatron's GPT dataset (documents packed end to end with an EOD token, so every position is "
        f"a target and the budget is exact; our choice here, neither paper's: paper 2 samples windows inside one "
        f"document and paper 1 describes no sampler), {gbs} sequences × {seq} tokens per step, "
        f"{plan.train_iters} steps = **{targets:,} prediction targets per run**. AdamW lr {r['lr']} → {r['min_lr']}, "
        f"{r['lr_warmup_iters']} warmup steps, cosine, weight decay {r['weight_decay']}, clip {r['clip_grad']}. "
        f"`--seed` sets initialization and data order: every variant sees the same batches at the same seed. "
        f"Recipe `{plan.recipe.relative_to(plan.recipe.parents[2])}`; each run's exact flags are in its record.\n\n"
        f"**Evaluation.** Held-out perplexity on the held-out documents in order, EOD before each, in windows of "
        f"{seq}, whole windows until at least {plan.eval_tokens:,} targets: {scored} scored targets "
        f"(the same windows for every run).\n\n{measured}"
    )


def write_report(plan: StudyPlan, records: dict[Run, dict], data: dict, out: Path, results_dir: Path) -> Path:
    """The page at ``out``; the plot and the hand-written reading live with the records."""
    seeds = sorted({r.seed for r in plan.runs})
    missing = [r.name for r in plan.runs if r not in records]
    status = (
        f"All {len(plan.runs)} runs of the plan are done."
        if not missing
        else f"**In progress: {len(records)} of {len(plan.runs)} runs done.** Still to run: {', '.join(missing)}. "
        "Re-running the command trains only these."
    )
    figure = plot_curves(records, results_dir / "loss_curves.png") if records else None
    table = variant_table(records)
    reading_path = results_dir / READING_FILE
    reading = (
        reading_path.read_text() if reading_path.is_file() else "(The reading is written when the study is complete.)"
    )
    dates = sorted(rec["date"] for rec in records.values())
    text = f"""# Small-scale study (CPU): learned input table vs fixed codes, with controls

<!-- run by tests/replication/test_replication.py::test_quick_study_end_to_end_skips_what_is_done_and_reproduces_a_run -->
```bash
python -m megatron_fixedcode.replication                   # trains what is not done yet, rewrites this page
python -m megatron_fixedcode.replication --verify binary:1 # retrains one run, compares with its record
python -m megatron_fixedcode.replication --quick           # CI smoke run (tiny, a temporary directory)
```

Every number below is read from the run records in [`{os.path.relpath(results_dir, out.parent)}/`]({os.path.relpath(results_dir, out.parent)}/) (one JSON per run:
its config hash, exact trainer flags, data fingerprint, held-out loss and perplexity, loss curve, speed);
the runner skips a run whose record has the current config hash. {status}
{f"Runs landed {dates[0]} – {dates[-1]}." if dates else ""}

Nothing on this page is a claim about the papers' regime (0.4–1.7B parameters, 17–100B tokens): it is a
CPU-sized model trained for minutes, and its proportions differ from the papers' too ({proportions(plan, records)}).

## Setup

{setup_text(plan, records, data)}

## Held-out perplexity (paper 1's format)

Per-seed held-out perplexity, the mean over seeds, the seed range (min – max, and max − min relative to
the mean), and the mean's difference from learned's mean in percent, computed from the unrounded values
of the records. Three seeds give a range, not a confidence interval; a control with one seed has no
range of its own, so read its difference from a neighbour smaller than the fixed codes' own relative
seed ranges as unresolved.

{chr(10).join(ppl_table(table, seeds)) if table else "No run has finished yet."}

## Loss curves

{f"![loss curves]({os.path.relpath(figure, out.parent)})" if figure else ""}

## Model readings (`tools/analyze_model.py`, seed {seeds[0]})

{chr(10).join(readings_tables(records))}

## Reading

{reading}
"""
    out.write_text(text)
    return out
