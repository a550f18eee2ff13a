"""The small-scale study: learned input table vs the fixed codes (three seeds each) and the controls
paper 2 asks for (norm-matched, centred, random, sinusoidal, learned low-dimensional, more
recodings), in a CPU regime with the papers' proportions; resumable across sittings.

    python -m megatron_fixedcode.replication            # trains what is not done, rewrites docs/REPLICATION.md
    python -m megatron_fixedcode.replication --quick    # CI: the same path, tiny, a temporary directory

``study`` holds the plan (runs, flags, config hash), ``data`` the corpus/tokenizer/index,
``evaluate`` the held-out perplexity and model readings, ``store`` the per-run records,
``report`` the page.
"""
