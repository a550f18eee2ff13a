"""The command line of ``python -m megatron_fixedcode.pretrain``: every flag, its checks and what it derives.

One module per concern (none imports torch; parsing reads no tokenizer library):

* ``core_flags`` -- the parser (model, input interface and data flags); each other concern's flags in a
  ``*_flags.py`` that owns them, the typed config built from them (``config_fields.from_dests``) and their
  refusals: ``parallel``, ``performance``, ``schedule``, ``optimizer``, ``health``, ``checkpoint``,
  ``logging``, ``downstream``, ``observe``, ``tokenizer``; ``architecture_flags`` -- the block's flags.
* ``inert_flags`` -- Megatron-LM flags accepted with no effect (each with its reason), or at Megatron's
  default only (each with what is built instead): one table row per flag.
* ``out_of_scope`` / ``added_after_core_016`` -- flags refused in one line, and why.
* ``derivations`` -- what Megatron-LM's ``validate_args`` derives from the flags.
* ``refusals`` -- every refusal that does not depend on the machine, applied at parse time (so
  ``--dry-run`` refuses what a run refuses).
* ``recipe`` -- ``--config RECIPE.yaml``; ``parse`` -- all of it, into a ``PretrainConfig`` of typed parts
  (the ``*_flags`` configs, ``models.config``, ``data.config``).
* ``memory_estimate`` -- the dry run's layout and memory per GPU; ``flag_table`` -- docs/flags.md.
* ``user_errors`` / ``tokenizer_flags`` -- the one-line errors and tokenizer flags every command shares.
"""
