"""A small-scale replication of the papers' comparison: learned vs binary vs gf2 (and optionally
the research interfaces), several seeds each, on the shared English corpus with the SmolLM2
tokenizer; held-out perplexity, LAMBADA last-word accuracy, docs/REPLICATION.md.

    python -m megatron_fixedcode.replication --quick          # CI: tiny, a temporary directory
    bash examples/replicate_small.sh                          # the committed run (~20 min, 2 CPU cores)
"""
