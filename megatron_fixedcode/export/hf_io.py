"""Hugging Face directory I/O: sharded safetensors + index, JSON files, tokenizer files."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_size(size: str | int) -> int:
    """``"5GB"``, ``"200MB"``, ``"10KB"`` or a byte count."""
    if isinstance(size, int):
        return size
    text = size.strip().upper()
    for suffix, factor in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3), ("B", 1)):
        if text.endswith(suffix) and text[: -len(suffix)].strip().replace(".", "", 1).isdigit():
            return int(float(text[: -len(suffix)]) * factor)
    if text.isdigit():
        return int(text)
    raise ValueError(f"--max-shard-size {size!r}: expected e.g. 5GB, 500MB or a byte count")


def write_safetensors(out_dir: Path, tensors: dict[str, torch.Tensor], max_shard_size: str | int = "5GB",
                      metadata: dict[str, str] | None = None) -> list[str]:
    """Shards of at most ``max_shard_size`` bytes (a bigger tensor gets its own shard) with a
    ``model.safetensors.index.json``; one ``model.safetensors`` when everything fits."""
    from safetensors.torch import save_file

    limit = parse_size(max_shard_size)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = tensor.contiguous()
        size += nbytes
    meta = {"format": "pt", **(metadata or {})}
    if len(shards) == 1:
        save_file(shards[0], str(out_dir / SINGLE_FILE), metadata=meta)
        return [SINGLE_FILE]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {}
    for shard_name, shard in zip(names, shards):
        save_file(shard, str(out_dir / shard_name), metadata=meta)
        weight_map.update({k: shard_name for k in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    write_json(out_dir / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": weight_map})
    return names


def read_safetensors(model_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of a HF directory (single file or index + shards)."""
    from safetensors.torch import load_file

    model_dir = Path(model_dir)
    if (model_dir / INDEX_FILE).exists():
        weight_map = json.loads((model_dir / INDEX_FILE).read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
    elif (model_dir / SINGLE_FILE).exists():
        files = [SINGLE_FILE]
    else:
        raise ValueError(f"{model_dir}: no {SINGLE_FILE} or {INDEX_FILE} (only safetensors checkpoints are read)")
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        tensors.update(load_file(str(model_dir / name)))
    return tensors


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_config(model_dir: Path) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ValueError(f"{model_dir}: no config.json")
    return json.loads(path.read_text())


def write_tokenizer(out_dir: Path, tokenizer_type: str | None, tokenizer_model: str | None,
                    tokenizer: Any, model_max_length: int) -> list[str]:
    """Copy the training tokenizer and describe it for ``AutoTokenizer`` (no BOS/EOS is added
    on encode: the training data had none but the EOD separator)."""
    if not tokenizer_model:
        return []
    src = Path(tokenizer_model)
    special = {"eos_token": tokenizer.detokenize([tokenizer.eod])}
    if tokenizer.bos is not None:
        special["bos_token"] = tokenizer.detokenize([tokenizer.bos])
    if tokenizer.pad is not None:
        special["pad_token"] = tokenizer.detokenize([tokenizer.pad])
    written = []
    if tokenizer_type == "HuggingFaceTokenizer":
        json_path = src / "tokenizer.json" if src.is_dir() else src
        shutil.copyfile(json_path, out_dir / "tokenizer.json")
        written.append("tokenizer.json")
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    else:
        shutil.copyfile(src, out_dir / "tokenizer.model")
        written.append("tokenizer.model")
        config = {"tokenizer_class": "LlamaTokenizer", "legacy": True, "add_bos_token": False,
                  "add_eos_token": False, "sp_model_kwargs": {}}
    config.update(special, model_max_length=model_max_length)
    write_json(out_dir / "tokenizer_config.json", config)
    write_json(out_dir / "special_tokens_map.json", special)
    return [*written, "tokenizer_config.json", "special_tokens_map.json"]
