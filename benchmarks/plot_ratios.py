"""Every benchmark ratio against its target, in one picture (the targets of docs/BENCHMARKS.md).

Reads the ``--json`` outputs of ``embedding.py``, ``train_step.py`` and ``dataloader.py`` (any
subset, in any order: each object names its benchmark) and draws one horizontal bar per ratio,
scaled so that the target is 1.0 and longer is better: ``measured / target`` for "at least"
targets, ``target / measured`` for "at most" targets.

Run::

    python benchmarks/embedding.py --json > emb.json
    python benchmarks/train_step.py --json > step.json
    python benchmarks/dataloader.py --json > data.json
    python benchmarks/plot_ratios.py emb.json step.json data.json --out docs/benchmark_ratios.png
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Ratio:
    label: str
    measured: float
    target: float
    at_least: bool  # True: measured >= target passes; False: measured <= target passes

    @property
    def score(self) -> float:
        """Measured over target, inverted for "at most" targets: >= 1.0 means the target holds."""
        return self.measured / self.target if self.at_least else self.target / self.measured

    @property
    def met(self) -> bool:
        return self.score >= 1.0


def collect_ratios(results: list[dict]) -> list[Ratio]:
    """The targeted ratios found in benchmark JSON objects."""
    rows: list[Ratio] = []
    for r in results:
        kind = r.get("benchmark")
        if kind == "embedding":
            rows.append(
                Ratio("input layer: fixed forward / bandwidth bound", r["fixed_fwd_fraction_of_bandwidth"], 0.95, True)
            )
            rows.append(Ratio("input layer: fixed / learned step time", r["fixed_over_learned_step_time"], 0.05, False))
        elif kind == "train_step":
            for rec in r["recipes"]:
                name = rec["recipe"] + (f" {rec['precision']}" if "precision" in rec else "")
                for inp in ("learned", "binary", "gf2"):
                    rows.append(
                        Ratio(f"{name}: megatron / torch tokens/s, {inp}", rec[f"megatron_over_torch_{inp}"], 0.8, True)
                    )
                for inp in ("binary", "gf2"):
                    rows.append(
                        Ratio(
                            f"{name}: {inp} / learned tokens/s",
                            rec[f"megatron_{inp}_over_learned_tokens_per_s"],
                            1.05,
                            True,
                        )
                    )
                rows.append(
                    Ratio(
                        f"{name}: peak saving / table state",
                        rec["megatron_binary_peak_saving_bytes"] / rec["table_state_bytes"],
                        1.0,
                        True,
                    )
                )
        elif kind == "dataloader":
            rows.append(Ratio("data: document windows samples/s / consumption", r["headroom"], 10.0, True))
            if "gpt_headroom" in r:
                rows.append(Ratio("data: megatron GPTDataset samples/s / consumption", r["gpt_headroom"], 10.0, True))
    return rows


def plot(rows: list[Ratio], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cap = 3.0  # the data loader's ~100x headroom would flatten every other bar
    fig, ax = plt.subplots(figsize=(9, 0.38 * len(rows) + 1.2))
    ys = range(len(rows))[::-1]
    scores = [min(row.score, cap) for row in rows]
    ax.barh(list(ys), scores, color=["tab:green" if row.met else "tab:red" for row in rows])
    ax.axvline(1.0, color="black", linewidth=1)
    for y, row, s in zip(ys, rows, scores):
        sign = ">=" if row.at_least else "<="
        ax.text(s + 0.03, y, f"{row.measured:.4g} (target {sign} {row.target:g})", va="center", fontsize=8)
    ax.set_yticks(list(ys), [row.label for row in rows], fontsize=8)
    ax.set_xlim(0, cap + 1.2)
    ax.set_xlabel("measured / target (inverted for 'at most' targets); right of the line = met")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results", nargs="+", type=Path, help="JSON outputs of the benchmarks (last line of each file)")
    p.add_argument("--out", type=Path, default=Path("docs/benchmark_ratios.png"))
    p.add_argument("--title", default="megatron-fixedcode benchmarks vs targets (CPU)")
    a = p.parse_args(argv)
    results = []
    for path in a.results:
        lines = [line for line in path.read_text().splitlines() if line.strip().startswith("{")]
        if not lines:
            raise SystemExit(f"{path}: no JSON object (run the benchmark with --json)")
        results.append(json.loads(lines[-1]))
    rows = collect_ratios(results)
    if not rows:
        raise SystemExit(f"no targeted ratios in {', '.join(map(str, a.results))}")
    plot(rows, a.out, a.title)
    for row in rows:
        print(f"{'met ' if row.met else 'MISS'} {row.label}: {row.measured:.4g} (target {row.target:g})")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
