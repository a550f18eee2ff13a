"""YAML files a user hands us (recipes), read safely: no Python tags (``safe_load``), and no
alias that refers to itself or expands past a bound.

PyYAML's composer keeps one node per anchor, so an alias bomb (``&a [x, x]``, ``&b [*a, *a]``, ...)
costs little to parse: it explodes in whatever walks the result (here: ``${VAR}`` expansion and
the data-path word split), and a self-referencing alias makes that walk recurse forever. Both are
refused on the node graph, before anything is built from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

MAX_EXPANDED_NODES = 100_000  # a paper recipe has ~100; a real file never comes near


def load_yaml(path: str | Path, max_nodes: int = MAX_EXPANDED_NODES) -> Any:
    """The document in ``path``; raises ``ValueError("PATH: reason")`` for a file that is not
    YAML, uses a recursive alias, or would expand to more than ``max_nodes`` nodes."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: {e}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is None:
            return None
        _check_expanded_size(node, max_nodes)
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {_describe(e)}") from None
    except RecursionError:
        raise ValueError(f"{path}: nested too deeply to be a recipe") from None
    except _TooLarge as e:
        raise ValueError(f"{path}: {e}") from None


def _describe(e: yaml.YAMLError) -> str:
    mark, problem = getattr(e, "problem_mark", None), getattr(e, "problem", None)
    if mark is None or problem is None:
        return " ".join(str(e).split())
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"


class _TooLarge(Exception):
    pass


def _check_expanded_size(root: yaml.Node, max_nodes: int) -> None:
    """Count the nodes the document has once every alias is expanded (a shared node counts each
    time it is used), refusing a cycle; each distinct node is visited once."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise _TooLarge(f"an alias refers to the node that contains it (line {node.start_mark.line + 1})")
        active.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        active.discard(key)
        if total > max_nodes:
            raise _TooLarge(
                f"expands to more than {max_nodes:,} values through its aliases "
                f"(line {node.start_mark.line + 1}); refusing an alias bomb"
            )
        sizes[key] = total
        return total

    size(root)
