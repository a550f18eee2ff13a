"""The package's shape: no import circle, files of 400 lines or fewer, the library not importing its CLI.

The import graph is read from the source with ``ast`` (nothing is imported): every ``import`` and
``from ... import`` among ``megatron_fixedcode`` modules, at module level AND inside functions.
Lazy (function-level) imports count: they keep ``-h`` and the dry run free of torch, but a circle
through one is still a circle — the two modules cannot be read, moved or tested one without the
other. So there are two rules, both with zero exceptions: no circle among modules, and no circle
among rooms (the subpackages and root modules of ``megatron_fixedcode``, e.g. ``export`` and
``training`` must not import each other, even lazily).

The 400-line rule and the CLI rule have no exceptions either.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "megatron_fixedcode"
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports (anywhere in its body)."""
    modules = _modules()

    def resolve(name: str) -> str | None:  # the longest prefix that is a module of the package
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                # ``from pkg import sub`` imports the submodule ``pkg.sub`` when there is one
                names = [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            targets |= {t for t in map(resolve, names) if t and t != module}
        graph[module] = targets
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index, low, stack, on_stack, circles, counter = {}, {}, [], set(), [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for succ in edges:
                if succ not in index:
                    index[succ] = low[succ] = counter[0]
                    counter[0] += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph.get(succ, ())))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        circles.append(sorted(component))
    return circles


def _room(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_the_graph_sees_lazy_and_relative_imports():
    graph = _import_graph()
    # a function-level import (the export hand-off reads export.hf_io inside a method)
    assert "megatron_fixedcode.export.hf_io" in graph["megatron_fixedcode.training.hf_export"]
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_among_modules():
    assert _circles(_import_graph()) == []


def test_no_import_circle_among_rooms():
    rooms: dict[str, set[str]] = {}
    for module, targets in _import_graph().items():
        rooms.setdefault(_room(module), set()).update(_room(t) for t in targets if _room(t) != _room(module))
    assert _circles(rooms) == []


def test_no_file_over_400_lines():
    lengths = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert sorted(name for name, n in lengths.items() if n > MAX_LINES) == []


def test_library_does_not_import_its_cli():
    """cli/ holds the commands' entry points: only tools/ and the entry points import it (lazy imports count)."""
    importers = {
        m
        for m, targets in _import_graph().items()
        if not m.startswith("megatron_fixedcode.cli") and any(t.startswith("megatron_fixedcode.cli") for t in targets)
    }
    assert sorted(importers) == []


@pytest.mark.parametrize("room", ["checkpoint", "export", "eval", "analysis", "replication"])
def test_rooms_below_training_do_not_import_it(room):
    """Reading a checkpoint in one process needs the checkpoint room, not the trainer."""
    graph = _import_graph()
    offenders = {
        m: sorted(t for t in targets if t.startswith("megatron_fixedcode.training"))
        for m, targets in graph.items()
        if _room(m) == f"megatron_fixedcode.{room}"
    }
    assert {m: t for m, t in offenders.items() if t} == {}


def test_training_reads_typed_configs_not_the_namespace():
    """After parsing, the trainer's room reads the typed parts of PretrainConfig (``cfg.optim``, ``cfg.data``,
    ``cfg.health`` ...): no ``<x>.args`` attribute read and no ``argparse`` import in ``training/``."""
    offenders = []
    for path in sorted((PACKAGE / "training").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            reads_args = isinstance(node, ast.Attribute) and node.attr == "args" and isinstance(node.ctx, ast.Load)
            imports_argparse = isinstance(node, ast.Import) and any(a.name == "argparse" for a in node.names)
            if reads_args or imports_argparse:
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert offenders == []


REPO = PACKAGE.parent
# Outside the arguments package and the tests: the package, the tools, scripts, benchmarks and examples.
OUTSIDE_ARGUMENTS = ("megatron_fixedcode", "tools", "scripts", "benchmarks", "examples")


def _pretrain_config_names(tree: ast.AST) -> set[str]:
    """Names a module binds to a PretrainConfig: ``cfg`` (the convention), ``x = parse_pretrain_args(...)``,
    and parameters or variables annotated ``PretrainConfig``."""

    def is_pretrain_config(annotation: ast.expr | None) -> bool:
        return annotation is not None and "PretrainConfig" in ast.unparse(annotation)

    names = {"cfg"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = node.value.func
            if (
                getattr(func, "id", None) == "parse_pretrain_args"
                or getattr(func, "attr", None) == "parse_pretrain_args"
            ):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if is_pretrain_config(node.annotation):
                names.add(node.target.id)
        elif isinstance(node, ast.arg) and is_pretrain_config(node.annotation):
            names.add(node.arg)
    return names


def _namespace_reads(tree: ast.AST) -> list[int]:
    """Lines reading ``.args`` (the parsed Namespace) off a PretrainConfig: ``cfg.args``, ``self.cfg.args``,
    ``parse_pretrain_args(...).args``."""
    names = _pretrain_config_names(tree)
    lines = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr == "args" and isinstance(node.ctx, ast.Load)):
            continue
        owner = node.value
        if isinstance(owner, ast.Call):
            owner = owner.func
        name = getattr(owner, "id", None) or getattr(owner, "attr", None)
        if name in names or name == "parse_pretrain_args":
            lines.append(node.lineno)
    return lines


def test_no_namespace_read_outside_the_arguments_package():
    """The parsed Namespace (``PretrainConfig.args``) is the arguments package's own: everything else (the
    dry run, the trainer, the tools and scripts) reads the typed parts (``cfg.schedule``, ``cfg.performance``,
    ``cfg.model_config(...)`` ...)."""
    offenders = []
    for root in OUTSIDE_ARGUMENTS:
        for path in sorted((REPO / root).rglob("*.py")):
            if (PACKAGE / "arguments") in path.parents:
                continue
            rel = path.relative_to(REPO).as_posix()
            offenders += [f"{rel}:{line}" for line in _namespace_reads(ast.parse(path.read_text()))]
    assert offenders == []


def _trees():
    return {path: ast.parse(path.read_text()) for path in PACKAGE.rglob("*.py")}


def test_one_owner_of_every_save_and_one_resume_decision():
    """Saves go through checkpoint/checkpointer.py (no object injects itself into the trainer); what a resume
    keeps is decided by one call of checkpoint.resume_scope.resume_scope (in the run plan)."""
    injected, decisions = [], []
    for path, tree in _trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Attribute) and target.attr == "async_saves":
                        if not (isinstance(target.value, ast.Name) and target.value.id == "self"):
                            injected.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name == "resume_scope":
                    decisions.append(path.relative_to(PACKAGE).as_posix())
    assert injected == []
    assert decisions == ["training/run_plan.py"]


def test_the_training_loop_reads_in_one_screen():
    tree = ast.parse((PACKAGE / "training" / "loop.py").read_text())
    (train,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "train"]
    assert train.end_lineno - train.lineno + 1 < 100


def test_one_builder_of_a_checkpoints_state_and_no_rewrite_of_the_checkpoint_config():
    """Every store's save and load build their sharded state in checkpoint/state.py (the copies had begun to
    differ); nothing outside arguments/ replaces cfg.checkpoint (the run plan carries the resume source)."""
    builders, rewrites = set(), []
    for path, tree in _trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "sharded_state_dict":
                builders.add(path.relative_to(PACKAGE).as_posix())
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", None) == "replace"
                and node.args
                and ast.unparse(node.args[0]).endswith(".checkpoint")
                and path.relative_to(PACKAGE).parts[0] != "arguments"
            ):
                rewrites.append(f"{path.name}:{node.lineno}")
    assert builders == {"checkpoint/state.py"} and rewrites == []
