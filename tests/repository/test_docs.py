"""Every shell block of README.md and docs/*.md runs here, or says in the doc why it does not.

The line right above a ```bash / ```sh / ```console block is one of:

    <!-- run -->                                  run as written (bash -e, repository root)
    <!-- run after docs/data.md -->                the same, after that page's `run` blocks
    <!-- run by tests/test_x.py::test_y, ... -->   an existing test runs it (checked to exist)
    <!-- not run: why -->                          e.g. needs Slurm and 16 GPUs

A run block sees `/tmp/` as a fresh directory of this test; nothing else is rewritten (blocks read
data from tests/assets, as a clone has it). Each block is one test with the id
`FILE:Lnn`; `pytest -rA tests/repository/test_docs.py` lists what ran, and each skip says why.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHELL = ("bash", "sh", "console")
MARKER = re.compile(
    r"^<!--\s*(run after (?P<after>\S+)|run by (?P<by>.+?)|not run:\s*(?P<why>.+?)|(?P<run>run))\s*-->$"
)
BLOCK_TIMEOUT_S = 300


@dataclass
class Block:
    doc: str  # path relative to the repository root
    line: int  # line of the opening fence
    code: str
    marker: str  # the comment above, "" when there is none

    @property
    def id(self) -> str:
        return f"{self.doc}:L{self.line}"


def doc_files(root: Path = REPO) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def shell_blocks(path: Path, root: Path = REPO) -> list[Block]:
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        if m.group(1) in SHELL:
            above = lines[i - 1].strip() if i else ""
            marker = above if above.startswith("<!--") else ""
            blocks.append(Block(str(path.relative_to(root)), i + 1, "\n".join(lines[i + 1 : end]), marker))
        i = end + 1
    return blocks


def parse_marker(block: Block) -> tuple[str, str]:
    """("run" | "after" | "by" | "skip", detail); ValueError for a block without a valid marker."""
    m = MARKER.match(block.marker)
    if not m:
        raise ValueError(
            f"{block.id}: a shell block needs <!-- run -->, <!-- run after DOC -->, "
            f"<!-- run by tests/FILE::TEST -->, or <!-- not run: why --> on the line above "
            f"(found {block.marker or 'nothing'!r})"
        )
    for kind in ("after", "by", "why"):
        if m.group(kind):
            return {"why": "skip"}.get(kind, kind), m.group(kind)
    return "run", ""


def check_tests_exist(spec: str, root: Path = REPO) -> list[str]:
    """The named tests (`tests/f.py::test`, `tests/f.py::Class::test`, comma separated); raises
    ValueError naming one that does not exist."""
    names = [s.strip() for s in spec.split(",") if s.strip()]
    for name in names:
        file, _, rest = name.partition("::")
        path = root / file
        if not path.is_file() or not rest:
            raise ValueError(f"no test {name!r}: {file} is not a file or no test is named")
        tree = ast.parse(path.read_text())
        scope = tree.body
        for part in rest.split("::"):
            found = [n for n in scope if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part]
            if not found:
                raise ValueError(f"no test {name!r}: {file} has no {part}")
            scope = found[0].body
    return names


def run_block(block: Block, workdir: Path, root: Path = REPO) -> subprocess.CompletedProcess:
    """Run one block with bash -e in `root`; /tmp/ rewritten as the module says."""
    workdir.mkdir(parents=True, exist_ok=True)
    code = block.code.replace("/tmp/", f"{workdir}/")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}", "TMPDIR": str(workdir)}
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", code],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
    )


ALL_BLOCKS = [b for f in doc_files() for b in shell_blocks(f)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("doc_blocks")


_done: set[str] = set()


def _run(block: Block, workdir: Path) -> None:
    r = run_block(block, workdir)
    print(f"{block.id} ran:\n{block.code}\n--- stdout (tail)\n{r.stdout[-2000:]}")
    assert r.returncode == 0, (
        f"{block.id} failed (exit {r.returncode}):\n{block.code}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    )
    _done.add(block.id)


@pytest.mark.slow
@pytest.mark.parametrize("block", ALL_BLOCKS, ids=[b.id for b in ALL_BLOCKS])
def test_doc_block(block, workdir):
    kind, detail = parse_marker(block)
    if kind == "skip":
        pytest.skip(f"{block.id} not run: {detail}")
    if kind == "by":
        names = check_tests_exist(detail)
        pytest.skip(f"{block.id} run by {', '.join(names)}")
    if kind == "after":
        for before in shell_blocks(REPO / detail):
            if parse_marker(before)[0] == "run" and before.id not in _done:
                _run(before, workdir)
    _run(block, workdir)


# The runner itself, on a fake repository.


def _fake_repo(tmp_path: Path, readme: str) -> Path:
    (tmp_path / "docs").mkdir(parents=True)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        "def test_y():\n    pass\n\nclass TestZ:\n    def test_w(self):\n        pass\n"
    )
    (tmp_path / "README.md").write_text(readme)
    return tmp_path


def test_runner_fails_a_broken_command_and_passes_a_working_one(tmp_path):
    root = _fake_repo(
        tmp_path / "repo",
        "# t\n\n<!-- run -->\n```bash\necho ok > /tmp/out\n"
        "python -c 'import sys; sys.exit(3)'   # broken on purpose\necho never\n```\n\n"
        "<!-- run -->\n```sh\npython -c 'print(1)'\ncat /tmp/out\n```\n",
    )
    broken, good = shell_blocks(root / "README.md", root)
    assert (broken.id, good.id) == ("README.md:L4", "README.md:L11")
    assert parse_marker(broken) == ("run", "")
    r = run_block(broken, tmp_path / "w", root)
    assert r.returncode == 3 and "never" not in r.stdout
    assert (tmp_path / "w" / "out").read_text() == "ok\n"  # /tmp/ is the test's directory
    r = run_block(good, tmp_path / "w", root)
    assert r.returncode == 0 and r.stdout == "1\nok\n"


def test_runner_refuses_unmarked_blocks_and_tests_that_do_not_exist(tmp_path):
    root = _fake_repo(
        tmp_path,
        "<!-- run by tests/test_x.py::test_y, tests/test_x.py::TestZ::test_w -->\n```bash\nx\n```\n"
        "\n```bash\nunmarked\n```\n<!-- run by tests/test_x.py::test_gone -->\n```console\nx\n```\n"
        "<!-- not run: needs 16 GPUs and Slurm -->\n```bash\nsbatch x\n```\n```python\nnot a shell block\n```\n",
    )
    by, unmarked, gone, slurm = shell_blocks(root / "README.md", root)
    kind, spec = parse_marker(by)
    assert kind == "by" and check_tests_exist(spec, root) == [
        "tests/test_x.py::test_y",
        "tests/test_x.py::TestZ::test_w",
    ]
    with pytest.raises(ValueError, match="README.md:L6: a shell block needs"):
        parse_marker(unmarked)
    with pytest.raises(ValueError, match="test_gone"):
        check_tests_exist(parse_marker(gone)[1], root)
    assert parse_marker(slurm) == ("skip", "needs 16 GPUs and Slurm")


def test_every_doc_block_is_marked():
    problems = []
    for b in ALL_BLOCKS:
        try:
            kind, detail = parse_marker(b)
            if kind == "by":
                check_tests_exist(detail)
            if kind == "after":
                assert (REPO / detail).is_file(), f"{b.id}: no page {detail}"
        except (ValueError, AssertionError) as e:
            problems.append(str(e))
    assert not problems, "\n".join(problems)


def _test_names(path: Path) -> set[str]:
    return {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def guarantee_test_problems(text: str, root: Path = REPO) -> list[str]:
    """Every test a row of docs/guarantees.md names exists: `tests/f.py::t`, `::t` (the file named
    last in the row), `tests/f.py`, or a bare `test_x` (the section's default file or the row's)."""
    problems, default = [], None
    for line in text.splitlines():
        m = re.match(r"Tests are in `(tests/\S+\.py)` unless named", line)
        if line.startswith("## "):
            default = None
        if m:
            default = m.group(1)
        if not line.startswith("| ") or line.startswith("| promise"):
            continue
        files = [default] if default else []
        for token in re.findall(r"`([^`]+)`", re.split(r"(?<!\\)\|", line)[-2]):
            file, sep, name = token.partition("::")
            if file.startswith("tests/") and file.endswith(".py"):
                if not (root / file).is_file():
                    problems.append(f"no file {file}")
                    continue
                files.append(file)
            elif not (file == "" and sep) and not token.startswith("test_"):
                continue
            name = name if sep else (token if token.startswith("test_") else "")
            if name and not any(name in _test_names(root / f) for f in files):
                problems.append(f"no test {token} (looked in {', '.join(files) or 'no file'})")
    return problems


def test_every_guarantee_names_a_test_that_exists():
    assert not guarantee_test_problems((REPO / "docs" / "guarantees.md").read_text())


def test_guarantee_check_catches_a_renamed_test(tmp_path):
    root = _fake_repo(tmp_path, "")
    text = (
        "## A\n\nTests are in `tests/test_x.py` unless named.\n\n| promise | test |\n|---|---|\n"
        "| ok | `test_y`, `tests/test_x.py::TestZ`, `::test_w` |\n| gone | `test_renamed` |\n"
    )
    assert guarantee_test_problems(text, root) == ["no test test_renamed (looked in tests/test_x.py)"]


MAX_DOC_WORDS = 20_000
GENERATED_MARKER = "<!-- generated by "  # a page generated from the code (docs/flags.md): its source is counted there


def test_readme_and_docs_stay_under_the_word_limit():
    """README.md and docs/*.md stay under 20,000 words (whitespace-separated). The one exception, by rule: a
    page whose first line opens with ``<!-- generated by`` is generated from the code and checked against it by
    a test of its own (docs/flags.md: tests/arguments/test_flag_table.py), so it is not counted."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    counted = [p for p in pages if not p.read_text().startswith(GENERATED_MARKER)]
    assert [p.name for p in pages if p not in counted] == ["flags.md"]
    assert sum(len(p.read_text().split()) for p in counted) < MAX_DOC_WORDS
