"""A crash while saving leaves the previous complete checkpoint as the one that loads."""

from pathlib import Path

import pytest
import torch
from megatron.core import dist_checkpointing

from megatron_fixedcode import checkpoint
from tests.helpers.checkpoints import make_trained_parts, weights


@pytest.mark.slow  # ~40 s: the fast lane stays under 2 minutes
def test_crash_during_save_keeps_previous_checkpoint(single_rank, tmp_path, monkeypatch):
    chunks, opt, sched = make_trained_parts(single_rank)
    state = {"step": 1, "tokens": 8, "layout": {"world_size": 1, "tp_size": 1, "pp_size": 1, "dp_size": 1}}
    checkpoint.save_checkpoint(str(tmp_path), 1, chunks, opt, sched, state, keep_last=2)
    saved = weights(chunks)
    for p in chunks[0].module.parameters():
        p.data.add_(1.0)  # training moved on

    real_save = dist_checkpointing.save

    def dies_half_way(state_dict, directory, *args, **kwargs):
        (Path(directory) / "__0_0.distcp").write_bytes(b"partial")
        raise KeyboardInterrupt("killed while writing")

    monkeypatch.setattr(dist_checkpointing, "save", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_checkpoint(str(tmp_path), 2, chunks, opt, sched, dict(state, step=2), keep_last=2)
    monkeypatch.setattr(dist_checkpointing, "save", real_save)

    assert checkpoint.latest_step(tmp_path) == 1
    assert (tmp_path / "iter_0000002").exists()  # the half-written directory is there, but not "latest"
    fresh, opt2, sched2 = make_trained_parts(single_rank)
    loaded = checkpoint.load_checkpoint(str(tmp_path), fresh, opt2, sched2)
    assert loaded["step"] == 1
    for key, value in weights(fresh).items():
        assert torch.equal(value, saved[key]), key
    with pytest.raises(ValueError, match="--ckpt-step 2: no complete checkpoint"):
        checkpoint.load_checkpoint(str(tmp_path), fresh, opt2, sched2, step=2)
