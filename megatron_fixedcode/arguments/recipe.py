"""``--config RECIPE.yaml``: a YAML file keyed by Megatron-LM's argument dests becomes the parser's
defaults (``${VAR}`` in strings is expanded from the environment; flags on the command line override it)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from megatron_fixedcode.arguments.architecture_flags import expand_block_key
from megatron_fixedcode.arguments.out_of_scope import SCOPE_NOTE, out_of_scope
from megatron_fixedcode.utils.yaml_files import load_yaml

# recipe keys of Megatron-LM's precision flags -> --precision
_PRECISION_ALIASES = {"bf16": "bf16"}


def _expand(value: Any) -> Any:
    if isinstance(value, str):
        return os.path.expandvars(value)
    if isinstance(value, list):
        return [_expand(v) for v in value]
    return value


def load_recipe(path: str, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """YAML recipe → parser defaults; unknown keys are refused naming the file and key."""
    try:
        data = load_yaml(path) or {}
    except ValueError as e:  # names the file; not YAML, a recursive alias or an alias bomb
        parser.error(f"--config {e}")
    if not isinstance(data, dict):
        parser.error(f"--config {path}: expected a mapping of flag names to values")
    known = {a.dest for a in parser._actions}
    for key in list(data):
        what = None if str(key) in known else out_of_scope("--" + str(key).replace("_", "-"))
        if what and data[key] not in (False, None):
            parser.error(f"--config {path}: {key}: {what}: {SCOPE_NOTE}")
        if what:
            del data[key]
    for alias, precision in _PRECISION_ALIASES.items():
        if data.get(alias) is True:  # `bf16: true` in a recipe = `precision: bf16`
            if data.get("precision", precision) != precision:
                parser.error(f"--config {path}: both {alias}: true and precision: {data['precision']}; keep one")
            del data[alias]
            data["precision"] = precision
        elif alias in data and data[alias] in (False, None):
            del data[alias]
    for key in data:
        if key.replace("-", "_") not in known or key in ("config", "dry_run", "precision_alias"):
            parser.error(f"--config {path}: unknown key {key!r}")
    values = {k.replace("-", "_"): _expand(v) for k, v in data.items()}
    try:
        expand_block_key(values)
    except ValueError as e:
        parser.error(f"--config {path}: {e}")
    for key in ("data_path", "train_data_path", "valid_data_path", "test_data_path"):
        if values.get(key) is not None:
            # A string (or an expanded ${VAR}) may hold several whitespace-separated entries.
            items = values[key] if isinstance(values[key], list) else [values[key]]
            values[key] = [word for item in items for word in str(item).split()]
    return values
