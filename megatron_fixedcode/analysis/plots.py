"""PNG plots of an analysis report (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path


def plot_report(report: dict, out: Path) -> list[Path]:
    from megatron_fixedcode.utils.lazy import require

    require("matplotlib", "plots", "analyze_model plots").use("Agg")
    import matplotlib.pyplot as plt

    title = f"{report['input_embedding']} @ step {report['step']}"
    sites = list(range(len(report["sites"])))
    paths = []

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    acts = report["activations"]["sites"]
    axes[0].plot(sites, [a["mean_norm"] for a in acts], "o-")
    axes[0].set(title="mean residual norm", xlabel="site (0 = input)")
    axes[1].plot(sites, [a["token_variance_fraction"] for a in acts], "o-")
    axes[1].set(title="variance explained by token identity", xlabel="site", ylim=(0, 1.05))
    axes[2].plot(sites, [a["mean_cosine"] for a in acts], "o-")
    axes[2].set(title="mean cosine of random pairs", xlabel="site")
    fig.suptitle(title)
    paths.append(_save(fig, out / "activations.png"))

    fig, ax = plt.subplots(figsize=(5, 3.6))
    blocks = report["ablation"]["blocks"]
    ax.bar([b["block"] for b in blocks], [b["delta"] for b in blocks])
    ax.set(title=f"{title}: loss change when a block is skipped", xlabel="block", ylabel="Δ loss (nats)")
    paths.append(_save(fig, out / "ablation.png"))

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name, rows in report["probes"].items():
        ax.plot(sites, [r["accuracy"] for r in rows], "o-", label=name)
        ax.plot(sites, [r["chance"] for r in rows], ":", color=ax.lines[-1].get_color())
    ax.set(title=f"{title}: linear probes (dotted: chance)", xlabel="site", ylabel="held-out accuracy", ylim=(0, 1.05))
    ax.legend(fontsize=7)
    paths.append(_save(fig, out / "probes.png"))

    fig, ax = plt.subplots(figsize=(7, 3.6))
    patch = report["patching"]
    matrix = patch["restored"] or patch["delta"]
    im = ax.imshow(matrix, aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1)
    ax.set(
        title=f"{title}: patching clean→corrupt ({'fraction restored' if patch['restored'] else 'Δ log p'})",
        xlabel="position",
        ylabel="site",
    )
    fig.colorbar(im, ax=ax)
    paths.append(_save(fig, out / "patching.png"))
    return paths


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
