"""How a run ends badly: the exceptions the trainer raises and the exit codes they map to
(:func:`megatron_fixedcode.training.loop.run_pretraining`). Each is raised alike on every rank,
so rank 0 alone reports it in one line."""

from __future__ import annotations


class NonFiniteTraining(RuntimeError):
    """A non-finite loss or gradient norm (``--check-for-nan-in-loss-and-grad``). ``local``: found
    by one rank in its own gradients (megatron DDP's check), so that rank reports it (naming
    itself) and exits; the launcher stops the others."""

    def __init__(self, message: str, local: bool = False):
        super().__init__(message)
        self.local = local


class DataError(ValueError):
    """Data that cannot be trained on as given (a damaged shard, a ``.bin``/``.idx`` mismatch, a
    token id outside the vocabulary): a user error, one line on rank 0 and exit code 2."""


class SaveFailed(ValueError):
    """A checkpoint could not be written (no space left on device, an OS error); the last
    complete checkpoint is kept. One line on rank 0, exit code 2."""


class ExportFailed(RuntimeError):
    """The Hugging Face export of the final checkpoint (``--hf-export-interval``) failed: raised on
    rank 0 only (the export runs there), after training and saving are done. One line naming the
    export and its log, exit code 4; the checkpoint is complete and can be exported again."""


class ReplicasDiverged(NonFiniteTraining):
    """The weights of the data-parallel replicas differ (``--check-weight-hash-across-dp-replicas-interval``):
    found alike on every rank, handled as a non-finite loss (one line on rank 0, exit code 3, nothing saved)."""


# what gloo's, NCCL's and the TCP store's errors say when a peer died or stopped answering
COLLECTIVE_FAILURE_TEXTS = ("gloo/transport", "Connection reset", "Connection closed", "Timed out waiting", "NCCL")


def is_collective_failure_text(text: str) -> bool:
    """An error's text that names a peer's failure: the attempts' failure reports keep text, not the exception,
    and are read on a login node or in the batch script, where torch is not imported (recovery/usable_nodes.py)."""
    return any(s in text for s in COLLECTIVE_FAILURE_TEXTS)


def is_collective_failure(error: BaseException) -> bool:
    """A collective that failed because a peer died or stopped answering (gloo's or NCCL's error, or
    torch's DistError), anywhere in the exception's chain or among the ranks' failures that torch's
    CheckpointException (a BaseException) gathers from a save or load."""
    import torch

    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, getattr(torch.distributed, "DistError", ())):
            return True
        if isinstance(error, RuntimeError) and is_collective_failure_text(str(error)):
            return True
        failures = getattr(error, "failures", None)  # {rank: (exception, traceback)}
        if isinstance(failures, dict) and any(
            is_collective_failure(f[0] if isinstance(f, tuple) else f) for f in failures.values()
        ):
            return True
        error = error.__cause__ or error.__context__
    return False
