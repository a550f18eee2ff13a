"""``pip install`` of the wheel gives working commands, as a user meets them, on the **oldest**
versions ``pyproject.toml`` allows: the wheel is built from a copy of the sources and installed
**with its dependencies** into a fresh venv where only torch and megatron-core are already
installed, as on a cluster. pip resolves under a constraints file that pins every dependency of the
core and of the extras installed here to its declared ``>=`` bound (:func:`lower_bounds`, read from
``pyproject.toml``: the two cannot drift), so a bound is the oldest version a test ran. The newest
versions run in the dev installs of both legs of scripts/test.sh.

From a temporary directory, with nothing of the checkout on the path: every command answers ``-h``;
a tokenizer is trained, a corpus indexed, a tiny model trained, exported to Hugging Face and
evaluated (``--load``), all with the core only; ``--hf-model`` is refused in one line naming the
``hf`` extra. Then the extras of README's install lines go in (``pip install 'wheel[...]'``, their
bounds) and each is used once: ``--hf-model``, a parquet input split into sentences (``data``),
training with TensorBoard and W&B (offline) logging, the fused CPU kernel built with ninja, a plot,
the LM Evaluation Harness on a local task (where the shared data is). Not here: te-* (needs CUDA).

torch and megatron-core sit in a base venv cached per (Python, their pins) under
``${MFC_VENV_CACHE:-~/.cache/megatron-fixedcode}`` (built once, ~1.5 min: the oldest torch is
PyPI's CUDA build, 5 GB with its CUDA libraries; it runs on CPU); the fresh venv sees it through a
``.pth`` file, so pip counts them as installed and installs the rest.
"""

from __future__ import annotations

import configparser
import fcntl
import json
import os
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import ASSETS, REPO

pytestmark = pytest.mark.slow

# the extras installed (after the core-only checks) and used once each: all but te-*, which needs CUDA
EXTRAS = ("hf", "kernel", "data", "tb", "wandb", "plots", "eval")
BASE = ("torch", "megatron-core", "numpy", "packaging")  # the base venv's pins: megatron-core requires the others
PIP = ["-m", "pip", "--disable-pip-version-check", "-q"]
TEXT = (
    "The binary code replaces the embedding table. Each token id becomes its bits, tiled across the "
    "model width. A learned table is the control. "
) * 40


def _run(cmd: list[str], ctx: dict, timeout: int = 600, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, env=ctx["env"], cwd=ctx["cwd"], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
    return proc


def _site_packages(python: Path) -> str:
    return subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def lower_bounds(extras=EXTRAS, pyproject: Path = REPO / "pyproject.toml") -> dict[str, str]:
    """{name: version}: the ``>=`` bound of each dependency of the core and of ``extras``; a
    dependency without one is an error (its oldest version would be untested)."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = [*project["dependencies"], *(r for e in extras for r in project["optional-dependencies"][e])]
    pins: dict[str, str] = {}
    for text in reqs:
        req = Requirement(text)
        low = [s.version for s in req.specifier if s.operator == ">="]
        if len(low) != 1:
            raise ValueError(f"pyproject.toml: {text!r} needs exactly one '>=' lower bound")
        name = canonicalize_name(req.name)
        if name not in pins or Version(low[0]) > Version(pins[name]):
            pins[name] = low[0]
    return pins


def readme_pip_lines(test: str = "test_installed_tool_trains_exports_and_evaluates") -> list[list[str]]:
    """The ``pip`` command lines of the README block marked as run by ``test`` (comments dropped)."""
    import shlex

    lines = (REPO / "README.md").read_text().splitlines()
    start = lines.index(f"<!-- run by tests/repository/test_wheel.py::{test} -->") + 2
    block = lines[start : lines.index("```", start)]
    return [shlex.split(line, comments=True) for line in block if line.startswith("pip ")]


def _as_run_here(args: list[str], ctx: dict) -> list[str]:
    """A README ``pip install`` line in the test's venv: ``.`` is the wheel, under the lower bounds
    (``--no-compile``: Python compiles what it imports; compiling every file cost ~20 s net here)."""
    assert args[:2] == ["pip", "install"], args
    wheel = [str(ctx["wheel"]) + a[1:] if a == "." or a.startswith(".[") else a for a in args[2:]]
    return [str(ctx["python"]), *PIP, "install", "--no-compile", "-c", str(ctx["constraints"]), *wheel]


def _constraints(root: Path) -> Path:
    path = root / "lower-bounds.txt"
    path.write_text("".join(f"{name}=={version}\n" for name, version in sorted(lower_bounds().items())))
    return path


def _base_venv() -> Path:
    """A venv with only torch and megatron-core (and what they require) at the lower bounds, built
    once per (Python, pins of BASE) and reused."""
    cache = Path(os.environ.get("MFC_VENV_CACHE", Path.home() / ".cache" / "megatron-fixedcode"))
    pins = [f"{name}=={version}" for name, version in lower_bounds().items() if name in BASE]
    tag = f"py{sys.version_info[0]}.{sys.version_info[1]}-" + "-".join(pins).replace("==", "-")
    base = cache / f"wheel-base-{tag}"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"wheel-base-{tag}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # xdist workers and concurrent checkouts build it once
        if not (base / ".mfc-ready").is_file():
            shutil.rmtree(base, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(base)], check=True, timeout=300)
            subprocess.run([str(base / "bin" / "python"), *PIP, "install", *pins], check=True, timeout=1800)
            (base / ".mfc-ready").write_text(" ".join(pins) + "\n")
    return base


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    # symlinks=False: the recipe and task links are copied as the files they point to
    shutil.copytree(
        REPO / "megatron_fixedcode",
        src / "megatron_fixedcode",
        symlinks=False,
        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyc"),
    )
    subprocess.run(
        [sys.executable, *PIP, "wheel", "--no-deps", "--no-build-isolation", "-w", str(root / "dist"), str(src)],
        check=True,
        cwd=root,
        capture_output=True,
        timeout=300,
    )
    wheel = next((root / "dist").glob("megatron_fixedcode-*.whl"))
    constraints = _constraints(root)
    base = _base_venv()
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    Path(_site_packages(python), "_mfc_base.pth").write_text(_site_packages(base / "bin" / "python") + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    work = root / "elsewhere"
    work.mkdir()
    ctx = {"env": env, "cwd": work, "wheel": wheel, "python": python, "constraints": constraints}
    # README's laptop lines as written: its torch line (the CPU index, not reachable here) is the base
    # venv's torch; `pip install .` goes in here, `pip install '.[hf,kernel]'` after the core-only checks
    readme = readme_pip_lines()
    assert readme[0] == ["pip", "install", "torch", "--index-url", "https://download.pytorch.org/whl/cpu"], readme
    assert readme[1] == ["pip", "install", "."] and len(readme) == 3 and readme[2][2].startswith(".["), readme
    ctx["readme_extras"] = readme[2]
    _run(_as_run_here(readme[1], ctx), ctx, timeout=1200)  # pip resolves the rest
    return venv, ctx


def _scripts() -> list[str]:
    import tomllib

    return sorted(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])


def test_wheel_carries_data_and_scripts(installed):
    venv, ctx = installed
    names = set(zipfile.ZipFile(ctx["wheel"]).namelist())
    for needed in (
        "megatron_fixedcode/kernels/fixed_code_cpu.cpp",
        "megatron_fixedcode/recipes/tiny_cpu.yaml",
        "megatron_fixedcode/eval/tasks/fixedcode_local.yaml",
        "megatron_fixedcode/eval/tasks/local_data.py",
        "megatron_fixedcode/export/modeling_fixedcode.py",
    ):
        assert needed in names, needed
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    parser = configparser.ConfigParser()
    parser.read_string(zipfile.ZipFile(ctx["wheel"]).read(entry).decode())
    assert sorted(parser["console_scripts"]) == _scripts() and len(_scripts()) >= 10
    probe = (
        "import megatron_fixedcode, megatron_fixedcode.quickstart_pipeline as q, megatron_fixedcode.eval.harness as h;"
        "print(megatron_fixedcode.__file__, q.TINY_RECIPE.is_file(), (h.LOCAL_TASKS_DIR / 'fixedcode_local.yaml').is_file())"
    )
    out = _run([str(ctx["python"]), "-c", probe], ctx).stdout.split()
    assert out[0].startswith(_site_packages(ctx["python"])) and out[1:] == ["True", "True"]
    for script in _scripts():  # each is one short process: -h parses before importing torch
        proc = _run([str(venv / "bin" / script), "-h"], ctx, timeout=300)
        assert "usage:" in proc.stdout, (script, proc.stderr)


def test_installed_analyze_code_and_dry_run(installed):
    venv, ctx = installed
    proc = _run(
        [str(venv / "bin" / "mfc-analyze-code"), "--vocab-size", "49152", "--hidden-size", "2048", "--json"], ctx
    )
    assert json.loads(proc.stdout)["K"] == 16 and json.loads(proc.stdout)["collisions"] == 0, proc.stderr
    recipe = Path(_site_packages(ctx["python"])) / "megatron_fixedcode" / "recipes" / "tiny_cpu.yaml"
    proc = _run([str(venv / "bin" / "mfc-pretrain"), "--config", str(recipe), "--dry-run"], ctx)
    assert '"num_layers"' in proc.stdout, proc.stderr


def test_installed_tool_trains_exports_and_evaluates(installed):
    """The first commands a user runs, each from the installed wheel with only its core dependencies."""
    venv, ctx = installed
    bin_ = venv / "bin"
    work = ctx["cwd"]
    corpus = work / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"Document {i}. {TEXT}"}) + "\n" for i in range(24)))
    (work / "text").mkdir()
    (work / "text" / "doc.txt").write_text(TEXT)
    _run(
        [str(bin_ / "mfc-train-tokenizer"), "--input", str(work / "text"), "--output", "tok", "--vocab-size", "300"],
        ctx,
    )
    _run(
        [
            str(bin_ / "mfc-preprocess-data"),
            "--input",
            str(corpus),
            "--output-prefix",
            "data/corpus",
            "--tokenizer-type",
            "HuggingFaceTokenizer",
            "--tokenizer-model",
            "tok",
            "--append-eod",
            "--workers",
            "1",
        ],
        ctx,
    )
    prefix = str(work / "data" / "corpus_train_text_document")
    assert Path(prefix + ".bin").is_file() and Path(prefix + ".idx").is_file()
    recipe = Path(_site_packages(ctx["python"])) / "megatron_fixedcode" / "recipes" / "tiny_cpu.yaml"
    _run(
        [
            str(bin_ / "mfc-pretrain"),
            "--config",
            str(recipe),
            "--data-path",
            prefix,
            "--tokenizer-model",
            "tok",
            "--split",
            "90,10,0",
            "--train-iters",
            "2",
            "--eval-iters",
            "1",
            "--seq-length",
            "32",
            "--micro-batch-size",
            "2",
            "--global-batch-size",
            "2",
            "--save",
            "ckpt",
            "--save-interval",
            "2",
        ],
        ctx,
    )
    converted = _run([str(bin_ / "mfc-convert-checkpoint-to-hf"), "--load", "ckpt", "--output", "hf"], ctx)
    assert (work / "hf" / "config.json").is_file()
    # without transformers (the core install) the export is written and its parity check skipped, saying so
    assert "parity check skipped: transformers is not installed" in converted.stderr, converted.stderr
    assert not (work / "hf" / "parity.json").exists()
    out = json.loads(
        _run([str(bin_ / "mfc-evaluate"), "--load", "ckpt", "--text-files", "text/doc.txt", "--json"], ctx).stdout
    )
    assert out["tokens"] > 0 and out["loss"] > 0
    # --hf-model needs transformers: without the extra, one line naming it
    proc = _run(
        [str(bin_ / "mfc-evaluate"), "--hf-model", "hf", "--text-files", "text/doc.txt", "--json"], ctx, check=False
    )
    assert proc.returncode == 2 and "pip install 'megatron-fixedcode[hf]'" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    # the extras at their lower bounds (the same constraints), each used once: README's, then the others
    _run(_as_run_here(ctx["readme_extras"], ctx), ctx, timeout=1200)
    rest = [e for e in EXTRAS if e not in ctx["readme_extras"][2][2:-1].split(",")]
    _run(_as_run_here(["pip", "install", f".[{','.join(rest)}]"], ctx), ctx, timeout=1200)
    hf = json.loads(
        _run(
            [
                str(bin_ / "mfc-evaluate"),
                "--hf-model",
                "hf",
                "--text-files",
                "text/doc.txt",
                "--seq-length",
                "32",
                "--json",
            ],
            ctx,
        ).stdout
    )
    assert hf["tokens"] > 0 and abs(hf["loss"] - out["loss"]) < 1e-3 * out["loss"], (hf, out)
    _run([str(bin_ / "mfc-check-hf-export"), "--load", "ckpt", "--hf-dir", "hf", "--report", "parity.json"], ctx)
    assert json.loads((work / "parity.json").read_text())["passed"] is True  # now with transformers
    # data: a parquet input (pyarrow), split into sentences (nltk)
    _run(
        [
            str(ctx["python"]),
            "-c",
            "import pyarrow as pa, pyarrow.parquet as pq, sys; "
            "pq.write_table(pa.table({'text': sys.argv[2:]}), sys.argv[1])",
            "corpus.parquet",
            TEXT,
            TEXT[:200],
        ],
        ctx,
    )
    _run(
        [
            str(bin_ / "mfc-preprocess-data"),
            "--input",
            "corpus.parquet",
            "--output-prefix",
            "data/pq",
            "--tokenizer-type",
            "HuggingFaceTokenizer",
            "--tokenizer-model",
            "tok",
            "--split-sentences",
            "--workers",
            "1",
        ],
        ctx,
    )
    assert json.loads((work / "data" / "pq_summary.json").read_text())["documents"] == {"train": 2, "valid": 0}
    # the .idx header (megatron-core's _IndexWriter): sequences, then documents + 1, after 18 bytes
    sequences, documents = struct.unpack_from("<QQ", (work / "data" / "pq_train_text_document.idx").read_bytes(), 18)
    assert (sequences, documents - 1) == (3 * 40 + 5, 2)  # the sentences of TEXT and of TEXT[:200]
    # tb, wandb (offline) and kernel (ninja builds the fused CPU kernel; `fused` fails if it cannot):
    # two more steps from the checkpoint
    env = {**ctx["env"], "WANDB_MODE": "offline", "WANDB_DIR": str(work), "TORCH_EXTENSIONS_DIR": str(work / "ext")}
    _run(
        [
            str(bin_ / "mfc-pretrain"),
            "--config",
            str(recipe),
            "--data-path",
            prefix,
            "--tokenizer-model",
            "tok",
            "--split",
            "90,10,0",
            "--train-iters",
            "4",
            "--eval-iters",
            "1",
            "--seq-length",
            "32",
            "--micro-batch-size",
            "2",
            "--global-batch-size",
            "2",
            "--load",
            "ckpt",
            "--save",
            "ckpt",
            "--save-interval",
            "2",
            "--tensorboard-dir",
            "tb",
            "--wandb-project",
            "mfc-wheel",
            "--code-kernel",
            "fused",
        ],
        {**ctx, "env": env},
    )
    assert list((work / "tb").glob("events.out.tfevents.*")) and list((work / "wandb").glob("offline-run-*"))
    assert list((work / "ext").rglob("*.so"))
    # plots (matplotlib): analyze-model's plots of a small report
    report = {
        "input_embedding": "binary",
        "step": 4,
        "sites": ["input", "block 0"],
        "activations": {"sites": [{"mean_norm": 1.0, "token_variance_fraction": 0.5, "mean_cosine": 0.1}] * 2},
        "ablation": {"blocks": [{"block": 0, "delta": 0.2}]},
        "probes": {"token_identity": [{"accuracy": 0.9, "chance": 0.25}] * 2},
        "patching": {"restored": [[0.5, -0.5]] * 2, "delta": None},
    }
    (work / "report.json").write_text(json.dumps(report))
    _run(
        [
            str(ctx["python"]),
            "-c",
            "import json, pathlib; from megatron_fixedcode.analysis.plots import plot_report; "
            "plot_report(json.loads(pathlib.Path('report.json').read_text()), pathlib.Path('.'))",
        ],
        ctx,
    )
    assert all((work / f"{name}.png").stat().st_size > 0 for name in ("activations", "ablation", "probes", "patching"))
    # eval (lm-eval, accelerate): the harness on the export, a local task from tests/assets (LAMBADA:
    # one-word continuations fit the model's 32 tokens)
    env = {**ctx["env"], "MFC_SHARED_DATA": str(ASSETS), "HF_DATASETS_CACHE": str(work / "hf_datasets")}
    res = json.loads(
        _run(
            [
                str(bin_ / "mfc-evaluate"),
                "--hf-model",
                "hf",
                "--tasks",
                "lambada_local",
                "--limit",
                "4",
                "--batch-size",
                "4",
                "--json",
            ],
            {**ctx, "env": env},
        ).stdout
    )
    row = res["results"]["lambada_local@0shot"]
    assert row["perplexity"] > 1 and 0 <= row["acc"] <= 1 and res["requests"]["lambada_local@0shot"]["requests"] == 4
