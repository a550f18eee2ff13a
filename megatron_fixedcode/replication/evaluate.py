"""In-process evaluation of a finished run: held-out perplexity on a fixed token budget (the same
windows of the held-out documents for every run) and, for the analysed runs, the
``tools/analyze_model.py`` readings the report tabulates."""

from __future__ import annotations

from pathlib import Path


def heldout_perplexity(load: str, valid_prefix: str, *, max_tokens: int) -> dict:
    from megatron_fixedcode.checkpoint.single_process import load_megatron_checkpoint
    from megatron_fixedcode.eval.perplexity import document_nll, indexed_documents, megatron_logits_fn
    from megatron_fixedcode.tokenizers import checkpoint_tokenizer

    ckpt = load_megatron_checkpoint(load)
    cfg, state = ckpt.model_cfg, ckpt.trainer_state
    tokenizer = checkpoint_tokenizer(state["tokenizer"], ckpt.path.parent, f"--load {load}")
    ppl = document_nll(
        megatron_logits_fn(ckpt.model, cfg.vocab_size),
        indexed_documents(valid_prefix),
        seq_length=cfg.seq_length,
        eod=tokenizer.eod,
        max_tokens=max_tokens,
    )
    return {
        "step": ckpt.step,
        "tokens_trained": state["tokens"],
        "val_loss": ppl["loss"],
        "val_ppl": ppl["ppl"],
        "val_tokens": ppl["tokens"],
        "parameters": sum(p.numel() for p in ckpt.model.parameters()),
    }


def model_readings(load: str, valid_prefix: str, output_dir: Path, *, windows: int) -> dict:
    """Residual-stream norm and anisotropy by depth, and the loss increase when each block is
    skipped (``tools/analyze_model.py`` on held-out windows), reduced to what the report shows."""
    from megatron_fixedcode.analysis.run import AnalysisConfig, run_analysis

    report = run_analysis(
        AnalysisConfig(load=load, output_dir=str(output_dir), data_path=valid_prefix, num_windows=windows)
    )
    return {
        "sites": report["sites"],
        "mean_norm": [site["mean_norm"] for site in report["activations"]["sites"]],
        "mean_cosine": [site["mean_cosine"] for site in report["activations"]["sites"]],
        "ablation_loss": report["ablation"]["loss"],
        "ablation_delta": [row["delta"] for row in report["ablation"]["blocks"]],
    }
