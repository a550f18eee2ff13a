"""The checkpoint room: saving, loading, verifying and reading a checkpoint, on every rank of a
trainer or in one process (evaluation, analysis, the Hugging Face export).

Layout on disk: ``SAVE/iter_0000100/`` per checkpoint, ``SAVE/latest_checkpointed_iteration.txt``
naming the newest *complete* one — written (atomically) only after every rank finished saving, so a
crash while saving leaves the previous checkpoint as the one that loads. Weights and optimizer state
reshard to any TP/PP/DP layout on load; what a load keeps is decided in :mod:`.resume_scope`. Saves
and loads use megatron's fully parallel strategy wrappers (the data-parallel ranks share the
replicated tensors' writes and reads).

Integrity: after every rank finished writing, each rank hashes the files it wrote and rank 0 records
the size and SHA-256 of every file in ``iter_N/checksums.json`` (``shared``: the run's carried
tokenizer, ``SAVE/tokenizer/<hash>/``, one copy for all its checkpoints) — the last file written before the
``latest`` marker moves, so the marker covers it. Every load (``--load``, ``--skip-train``, the HF
converter, ``tools/evaluate.py``) verifies them first (the trainer's ranks each hash a share) and
refuses a checkpoint whose bytes changed, naming the file and the newest older checkpoint that
verifies (``--ckpt-step N``).

* :mod:`.paths` — where a checkpoint lives, the ``latest`` marker, the common state read without ranks;
* :mod:`.state` — what it holds (model, optimizer format, RNG objects);
* :mod:`.verify` — checksums recorded and verified; :mod:`.save`, :mod:`.load` — every rank;
* :mod:`.resume_scope` — what a resume keeps on another layout (pure);
* :mod:`.save_checks`, :mod:`.load_checks` — ``--save`` probes and readable write failures; loaded weights finite;
* :mod:`.stores` — the three stores (persistent, global non-persistent, local) behind one interface;
* :mod:`.resume_source` — which store and step a resume loads, decided once; :mod:`.checkpointer` — every save;
* :mod:`.local` — ``--non-persistent-ckpt-type local``: each rank's file in node-local storage (nvidia-resiliency-ext);
* :mod:`.single_process` — any checkpoint into a TP=1/PP=1 model in one process, and one saved from it.
"""

from megatron_fixedcode.utils.lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(
        [
            "CHECKSUMS",
            "LATEST_MARKER",
            "RUN_CONFIG",
            "CorruptCheckpoint",
            "checkpoint_dir",
            "latest_step",
            "read_common_state",
            "read_common_state_of",
            "read_trainer_state",
            "resolve_step",
        ],
        "paths",
    ),
    **dict.fromkeys(
        ["RNG_BY_MODEL_PARALLEL_RANK", "layout_of", "model_sharded_state", "optimizer_format", "unwrap"], "state"
    ),
    "LocalCheckpoints": "local",
    **dict.fromkeys(
        [
            "CHECKSUMS_CLAIM",
            "NO_VERIFY_FLAG",
            "corrupt_message",
            "newest_verified_step",
            "record_checksums",
            "verified_step",
            "verify_checkpoint",
            "verify_checkpoint_share",
            "write_checksums",
        ],
        "verify",
    ),
    "save_checkpoint": "save",
    "load_checkpoint": "load",
    **dict.fromkeys(
        [
            "LoadedCheckpoint",
            "build_single_rank_model",
            "load_megatron_checkpoint",
            "megatron_logits",
            "save_megatron_checkpoint",
            "saved_padded_vocab",
        ],
        "single_process",
    ),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = sorted(_EXPORTS)
