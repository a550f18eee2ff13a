"""The GPU check's plan: its stages with their time budgets, and the wheels it installs offline.

One source of truth for scripts/gpu_check.sh (each stage runs under `timeout <budget>`),
scripts/download_gpu_wheels.sh (writes and checks the manifest) and the dry run:

    python scripts/gpu_check/plan.py show [--wheels DIR]        # plan, wheels, sizes, budgets; exit 1 if over a limit
    python scripts/gpu_check/plan.py budget STAGE               # seconds for one stage
    python scripts/gpu_check/plan.py stages                     # their names, in order
    python scripts/gpu_check/plan.py requirements               # name==version of every manifest wheel (pip install -r)
    python scripts/gpu_check/plan.py wheels [--wheels DIR] [--strict]   # the folder against the manifest
    python scripts/gpu_check/plan.py write-manifest --wheels DIR
    python scripts/gpu_check/plan.py missing --wheels DIR       # the wheels THIS python lacks (one path a line)

The manifest (scripts/gpu_check/wheels.txt, committed; written by download_gpu_wheels.sh) lists
`name==version  file  bytes`, so the dry run can size the carry without the wheels folder (CI).
Limits: the wheels travel with the checkout to the GPU machine, at most 64 MiB; the whole check
must finish in under 8 minutes, so the stage budgets add up to at most TOTAL_LIMIT_S.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "wheels.txt"
WHEELS_LIMIT_BYTES = 64 * 2**20  # what may travel with the checkout
TOTAL_LIMIT_S = 480  # 8 minutes, the GPU slot
# (stage, budget seconds, when it runs, what it does). Budgets are hard timeouts in gpu_check.sh.
# The stages that always run add up to at most TOTAL_LIMIT_S less a margin; the conditional TE ones
# (Transformer Engine cannot travel: its wheels are far over 64 MiB) run only where TE is already on
# the machine and only in the time left, so they are not counted.
BENCH = "paper-2 block (h 2048, FFN 8192 SwiGLU, 32 heads, seq 2048, micro batch 8), local layers, distributed optimizer, fusions on"
STAGES = [
    (
        "env",
        15,
        "always",
        "the python whose torch imports, CUDA/GPU, C compiler + Python.h (torch.compile), TE/FP8 -> env.json",
    ),
    (
        "install",
        45,
        "always",
        "only the manifest's wheels this python lacks (pip --no-index --no-deps --target SITE), "
        "import check, random-token bench data",
    ),
    (
        "compile",
        65,
        "C compiler + Python.h",
        "warm the inductor cache: 1 layer, 1 step, fp32-autocast-bf16 and --bf16 "
        "in parallel (cold torch.compile of the fused SwiGLU / bias-dropout-add)",
    ),
    ("bench:binary", 35, "always", f"{BENCH}; fp32-autocast-bf16 (the recipe): binary code"),
    ("bench:gf2", 35, "always", f"{BENCH}; fp32-autocast-bf16: GF(2)-recoded code"),
    ("bench:learned", 35, "always", f"{BENCH}; fp32-autocast-bf16: learned table"),
    ("bench:binary_bf16", 35, "always", f"{BENCH}; --bf16 (megatron's BF16 mode): binary code"),
    # two trainer starts (~15 s each: imports, model, the warm inductor cache), each writing or reading
    # and SHA-256-hashing ~2.7 GB (1 layer + the 49,152 x 2048 head, FP32 weights + Adam): ~5 s of
    # hashing at ~0.6 GB/s and a few s of I/O per run; ~70 s on a warm page cache, the rest for a cold disk
    (
        "ckpt",
        110,
        "always",
        "distributed checkpoint on the GPU: 4 steps saving at 2, then load step 2 and redo 3-4: "
        "losses and grad norms bit-identical",
    ),
    (
        "ckpt:2ranks",
        150,
        ">= 2 GPUs",
        "as ckpt on 2 ranks (NCCL reduce-scatter/all-gather, fully parallel save and "
        "load); one GPU: not run, NCCL refuses two ranks on one device",
    ),
    (
        "tests",
        80,
        "always",
        "pytest -m gpu: CUDA codes vs numpy, one step on CUDA, overlap flags; the TE ones skip "
        "with the reason where TE is not importable",
    ),
    ("bench:te", 45, "TE importable", "binary with Transformer Engine layers, --bf16 (only in time left)"),
    (
        "bench:te_autocast",
        45,
        "TE importable",
        "binary with Transformer Engine layers in the recipe's fp32-autocast-bf16 (only in time left)",
    ),
    ("bench:te_fp8", 45, "TE FP8 supported", "as bench:te with FP8 hybrid, delayed scaling (only in time left)"),
    ("report", 10, "always", "gpu_check.json + gpu_check.md"),
]
# not in the total: the TE ones run only where TE is on the machine, in the time left; the 2-rank one
# only where there are two GPUs (never on the lent single-GPU machine)
CONDITIONAL = {"bench:te", "bench:te_autocast", "bench:te_fp8", "ckpt:2ranks"}
TE_STAGES = ("bench:te", "bench:te_autocast", "bench:te_fp8")
# Why there is no 2-rank stage on one GPU: NCCL's init (src/init.cc) compares every pair of ranks'
# host hash and PCI bus id and fails with ncclInvalidUsage, "Duplicate GPU detected : rank 0 and
# rank 1 both on CUDA device ...", with no switch to allow it. The way around it (a distinct
# NCCL_HOSTID per rank, so that each looks like its own host) moves the traffic to the socket
# transport, not the NVLink/P2P path a real run takes, and MIG or MPS may not be set up on the lent
# machine: so two ranks are checked where two GPUs are, and on CPU (gloo) by --cpu-standin.
ONE_GPU_NO_NCCL_PAIR = (
    "one GPU: NCCL refuses two ranks on one device (init.cc: 'Duplicate GPU detected', "
    "ncclInvalidUsage); MIG/MPS may not be changed on the lent machine"
)
MARGIN_S = 15


def budget(stage: str) -> int:
    return dict((s, b) for s, b, _, _ in STAGES)[stage]


def total_budget() -> int:
    """What the stages that can run on the target machine (no TE) add up to."""
    return sum(b for s, b, _, _ in STAGES if s not in CONDITIONAL)


def read_manifest(path: Path = MANIFEST) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            spec, file, size = line.split()
            rows.append({"spec": spec, "file": file, "bytes": int(size)})
    return rows


def ensure_packaging(wheels: Path | None) -> None:
    """``packaging`` from the wheels folder when this python has none (it is what the install stage
    installs, so it cannot be needed before): a pure-Python wheel is a zip that ``import`` reads."""
    import importlib.util

    if importlib.util.find_spec("packaging") is not None:
        return
    found = sorted(wheels.glob("packaging-*-py3-none-any.whl")) if wheels is not None and wheels.is_dir() else []
    if not found:
        raise SystemExit(
            f"this python has no `packaging` and {wheels} has no packaging-*-py3-none-any.whl "
            "(run scripts/download_gpu_wheels.sh)"
        )
    sys.path.insert(0, str(found[-1]))


def scan(wheels: Path) -> list[dict]:
    ensure_packaging(wheels)
    from packaging.utils import canonicalize_name, parse_wheel_filename

    rows = []
    for whl in sorted(wheels.glob("*.whl")):
        name, version, *_ = parse_wheel_filename(whl.name)
        rows.append({"spec": f"{canonicalize_name(name)}=={version}", "file": whl.name, "bytes": whl.stat().st_size})
    return rows


def write_manifest(wheels: Path, path: Path = MANIFEST) -> list[dict]:
    rows = scan(wheels)
    path.write_text(
        "# written by scripts/download_gpu_wheels.sh: name==version  file  bytes (the wheels gpu_check.sh installs)\n"
        + "".join(f"{r['spec']}  {r['file']}  {r['bytes']}\n" for r in rows)
    )
    return rows


# What the trainer and the GPU tests import (download_gpu_wheels.sh downloads these and their requirements).
ROOTS = ["megatron-core", "numpy", "packaging", "pyyaml", "psutil", "pytest", "tokenizers", "sentencepiece"]


def missing(wheels: Path, roots: list[str] = ROOTS) -> tuple[list[Path], list[str]]:
    """(wheel files to install, why each) for the python running this: a root it does not have, then
    the requirements of what is to be installed that it does not have or has at a version that does
    not satisfy them. What it has and satisfies is kept (its numpy, packaging, ... are never replaced);
    torch, triton and nvidia-* are never installed (the machine's CUDA torch provides them)."""
    import importlib.metadata as md
    import zipfile

    ensure_packaging(wheels)
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name, parse_wheel_filename
    from wheel_deps import PROVIDED_BY_THE_MACHINE

    files = {canonicalize_name(parse_wheel_filename(w.name)[0]): w for w in sorted(wheels.glob("*.whl"))}
    have = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name:
            have.setdefault(canonicalize_name(name), dist.version)
    env = {**default_environment(), "extra": ""}
    chosen: dict[str, str] = {}
    queue = [(canonicalize_name(r), None, None) for r in roots]
    while queue:
        name, req, wanted_by = queue.pop(0)
        if name in chosen or PROVIDED_BY_THE_MACHINE.match(name):
            continue
        version = have.get(name)
        if version is not None and (req is None or req.specifier.contains(version, prereleases=True)):
            continue
        if name not in files:
            raise SystemExit(
                f"{name} is needed ({'not installed' if version is None else f'{version} installed'}"
                f"{f', {req} by {wanted_by}' if req else ''}) and {wheels} has no wheel of it"
            )
        chosen[name] = ("not installed" if version is None else f"installed {version} does not satisfy {req}") + (
            f" (required by {wanted_by})" if wanted_by else ""
        )
        with zipfile.ZipFile(files[name]) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            for line in z.read(meta).decode().splitlines():
                if line.startswith("Requires-Dist:"):
                    r = Requirement(line.split(":", 1)[1].strip())
                    if r.marker is None or r.marker.evaluate(env):
                        queue.append((canonicalize_name(r.name), r, name))
    return [files[n] for n in chosen], [f"{files[n].name}: {why}" for n, why in chosen.items()]


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def wheel_report(wheels: Path | None, manifest: Path, strict: bool) -> tuple[list[str], bool]:
    """(lines, ok): the wheels (from the folder if there, else the manifest), their total, the limit."""
    listed = read_manifest(manifest) if manifest.exists() else []
    present = wheels is not None and wheels.is_dir() and any(wheels.glob("*.whl"))
    rows = scan(wheels) if present else listed
    lines, ok = [], True
    if present:
        lines.append(f"wheels in {wheels} ({len(rows)}):")
    else:
        lines.append(
            f"wheels: {wheels} is missing or empty (run scripts/download_gpu_wheels.sh where there is "
            f"network); sizes from the manifest {manifest.name} ({len(rows)}):"
        )
    lines += [f"  {r['spec']:<28} {r['bytes'] / 2**20:7.2f} MiB  {r['file']}" for r in rows]
    total = sum(r["bytes"] for r in rows)
    over = total > WHEELS_LIMIT_BYTES
    lines.append(
        f"wheels total: {mib(total)} ({total} bytes) of at most {mib(WHEELS_LIMIT_BYTES)}: "
        + ("OVER THE LIMIT" if over else "ok")
    )
    ok &= not over and bool(rows)
    if not rows:
        lines.append("no wheels and no manifest: nothing to install offline")
    if present and listed:
        diff = sorted({r["spec"] for r in rows} ^ {r["spec"] for r in listed})
        if diff:
            lines.append(
                f"the folder and the manifest differ: {' '.join(diff)}"
                + (" (run scripts/download_gpu_wheels.sh and commit scripts/gpu_check/wheels.txt)")
            )
            ok &= not strict
        else:
            lines.append("the folder matches the manifest")
    return lines, ok


def plan_lines() -> tuple[list[str], bool]:
    lines = ["plan (stage, budget = hard timeout, when, what):"]
    lines += [f"  {s:<17} {b:4d} s  {when:<21} {what}" for s, b, when, what in STAGES]
    total = total_budget()
    ok = total <= TOTAL_LIMIT_S
    lines.append(
        f"time budget total: {total} s of at most {TOTAL_LIMIT_S} s (8 min, install included; "
        f"{', '.join(sorted(CONDITIONAL))} not counted: only where they can run, in time left): "
        + (f"ok, {TOTAL_LIMIT_S - total} s margin" if ok else "OVER THE LIMIT")
    )
    lines.append(
        "not measurable here: Transformer Engine cannot travel (its wheels are far over the 64 MiB carry and "
        "transformer_engine_torch has no wheel), so TE, FP8 and context-parallel figures need a machine "
        "that already has TE"
    )
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "command", choices=["show", "budget", "stages", "requirements", "wheels", "write-manifest", "missing"]
    )
    p.add_argument("stage", nargs="?")
    p.add_argument("--wheels", type=Path, default=None)
    p.add_argument("--manifest", type=Path, default=MANIFEST)
    p.add_argument("--strict", action="store_true", help="the folder must match the manifest")
    a = p.parse_args(argv)
    if a.command == "stages":
        print("\n".join(s for s, _, _, _ in STAGES))
        return 0
    if a.command == "budget":
        print(budget(a.stage))
        return 0
    if a.command == "requirements":
        print("\n".join(r["spec"] for r in read_manifest(a.manifest)))
        return 0
    if a.command == "missing":
        paths, why = missing(a.wheels)
        print(
            "\n".join(f"install {w}" for w in why) or "nothing to install: this python has every package",
            file=sys.stderr,
        )
        print("\n".join(str(p) for p in paths))
        return 0
    if a.command == "write-manifest":
        rows = write_manifest(a.wheels, a.manifest)
        print(f"wrote {a.manifest} ({len(rows)} wheels)", file=sys.stderr)
        return 0
    ok = True
    if a.command == "show":
        lines, ok = plan_lines()
        print("\n".join(lines))
    lines, wheels_ok = wheel_report(a.wheels, a.manifest, a.strict)
    print("\n".join(lines))
    return 0 if ok and wheels_ok else 1


if __name__ == "__main__":
    sys.exit(main())
