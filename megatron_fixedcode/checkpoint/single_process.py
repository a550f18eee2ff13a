"""Checkpoints in one process: load any TP/PP checkpoint into a TP=1/PP=1 model, and save one.

megatron's ``dist_checkpointing`` reshards on load: a single process (world size 1, gloo on CPU)
asks for the full tensors and gets them, whatever layout wrote the checkpoint. Only the output
layer's vocabulary padding depends on the saving TP size; the model is built with the padded
size found in the checkpoint so the shapes agree.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing

from megatron_fixedcode.checkpoint.paths import LATEST_MARKER, _fsync_write, checkpoint_dir, read_trainer_state
from megatron_fixedcode.checkpoint.save import _fork_results_queue
from megatron_fixedcode.checkpoint.state import model_sharded_state
from megatron_fixedcode.checkpoint.verify import verified_step, write_checksums
from megatron_fixedcode.compat import ParallelLayout, initialize_distributed
from megatron_fixedcode.models import ModelConfig, build_gpt_model, build_transformer_config
from megatron_fixedcode.utils.finite import refuse_non_finite


@dataclasses.dataclass
class LoadedCheckpoint:
    model: torch.nn.Module  # InputInterfaceGPTModel at TP=1/PP=1, eval mode
    model_cfg: ModelConfig  # as trained (vocab_size = the tokenizer's true V)
    trainer_state: dict[str, Any]
    step: int
    path: Path


def single_process() -> Any:
    """World size 1 on gloo (or join an existing world of one)."""
    if dist.is_initialized() and dist.get_world_size() != 1:
        raise ValueError("checkpoint conversion runs in one process; launch it with python, not torchrun")
    return initialize_distributed(ParallelLayout())


def model_config_from_trainer_state(trainer_state: dict[str, Any]) -> ModelConfig:
    fields = dict(trainer_state["model_config"])
    # Same weights, built with megatron's local layers: TE-spec checkpoints load into them (the
    # sharded keys are the TE names in both specs), and no GPU is needed.
    fields.update(transformer_impl="local", bf16=False, autocast_bf16=False, recompute_granularity=None)
    return ModelConfig(**fields)


def saved_padded_vocab(path: Path) -> int:
    meta = dist_checkpointing.load_tensors_metadata(str(path))
    # a tied output layer (Megatron-LM's default, learned table only) is stored as the input table
    for name in ("output_layer.weight", "embedding.word_embeddings.weight"):
        if name in meta:
            return int(meta[name].global_shape[0])
    raise ValueError(
        f"{path}: no output_layer.weight or embedding.word_embeddings.weight in the checkpoint (not a GPT checkpoint?)"
    )


def build_single_rank_model(cfg: ModelConfig, padded_vocab: int | None = None) -> torch.nn.Module:
    """An unwrapped FP32 model at TP=1/PP=1; ``padded_vocab`` fixes the output-layer rows."""
    pg = single_process()
    if padded_vocab is not None:
        cfg = dataclasses.replace(cfg, make_vocab_size_divisible_by=padded_vocab, padded_vocab=None)
    config = build_transformer_config(cfg, ParallelLayout())
    return build_gpt_model(cfg, config, pg)


def load_megatron_checkpoint(root: str | Path, step: int | None = None, verify: bool = True) -> LoadedCheckpoint:
    """Load ``root`` (``SAVE`` dir with ``latest_checkpointed_iteration.txt``, or one ``iter_*`` dir);
    ``verify=False`` (``--no-verify-checkpoint``) skips the checksums."""
    root = Path(root)
    if not root.exists():
        raise ValueError(f"--load {root}: no such directory")
    if root.name.startswith("iter_") and (root / "metadata.json").exists():
        root, step = root.parent, int(root.name[5:])
    step = verified_step(str(root), step, verify=verify)  # refuses bytes changed since the save
    if step is None:
        raise ValueError(f"--load {root}: no complete checkpoint ({LATEST_MARKER} missing)")
    path = checkpoint_dir(root, step)
    trainer_state = read_trainer_state(str(root), step)
    cfg = model_config_from_trainer_state(trainer_state)
    torch.manual_seed(0)
    model = build_single_rank_model(cfg, saved_padded_vocab(path))
    loaded = dist_checkpointing.load(model_sharded_state([model]), str(path))  # the model alone: no optimizer, RNG
    model.load_state_dict(loaded["model"])
    refuse_non_finite(model.state_dict().items(), f"--load {path}", "use these weights")
    model.eval()
    return LoadedCheckpoint(model=model, model_cfg=cfg, trainer_state=trainer_state, step=step, path=path)


def save_megatron_checkpoint(
    root: str | Path, model: torch.nn.Module, trainer_state: dict[str, Any], step: int = 0
) -> Path:
    """Write ``root/iter_STEP`` (model weights + trainer dict) and the ``latest`` marker, as the
    trainer does; it loads at any TP/PP with ``--load root --finetune``."""
    single_process()
    target = checkpoint_dir(root, step)
    if target.exists():
        raise ValueError(f"--save {root}: {target} already exists")
    target.mkdir(parents=True)
    _fork_results_queue()
    dist_checkpointing.save({**model_sharded_state([model]), "trainer": trainer_state}, str(target))
    write_checksums(target)
    _fsync_write(Path(root) / LATEST_MARKER, str(step))
    return target


@torch.no_grad()
def megatron_logits(model: torch.nn.Module, ids_BS: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[B, S, V]`` float logits of a single-rank model (vocabulary padding removed)."""
    ids_BS = ids_BS.to(torch.int64)
    position_ids = torch.arange(ids_BS.shape[1], device=ids_BS.device).expand_as(ids_BS)
    logits_BSV = model(ids_BS, position_ids, None)
    return logits_BSV[..., :vocab_size].float()
