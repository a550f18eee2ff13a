"""The small-scale study: learned input table vs the fixed codes (three seeds each) and our controls
(norm-matched, for the unmatched scale paper 2 names as a confound; centred, random, sinusoidal,
learned low-dimensional, more recodings), in a CPU regime whose proportions differ from the papers'
(d/K = 16, table share 18.6%); resumable across sittings.

    python -m megatron_fixedcode.replication            # trains what is not done, rewrites docs/REPLICATION.md
    python -m megatron_fixedcode.replication --quick    # CI: the same path, tiny, a temporary directory

``study`` holds the plan (runs, flags, config hash), ``data`` the corpus/tokenizer/index,
``evaluate`` the held-out perplexity and model readings, ``store`` the per-run records,
``report`` the page.
"""
