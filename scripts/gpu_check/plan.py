"""The GPU check's plan: its stages with their time budgets, and the wheels it installs offline.

One source of truth for scripts/gpu_check.sh (each stage runs under `timeout <budget>`),
scripts/download_gpu_wheels.sh (writes and checks the manifest) and the dry run:

    python scripts/gpu_check/plan.py show [--wheels DIR]        # plan, wheels, sizes, budgets; exit 1 if over a limit
    python scripts/gpu_check/plan.py budget STAGE               # seconds for one stage
    python scripts/gpu_check/plan.py requirements               # name==version of every manifest wheel (pip install -r)
    python scripts/gpu_check/plan.py wheels [--wheels DIR] [--strict]   # the folder against the manifest
    python scripts/gpu_check/plan.py write-manifest --wheels DIR

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
WHEELS_LIMIT_BYTES = 64 * 2**20      # what may travel with the checkout
TOTAL_LIMIT_S = 480                   # 8 minutes, the GPU slot
# (stage, budget seconds, when it runs, what it does). Budgets are hard timeouts in gpu_check.sh.
STAGES = [
    ("env", 15, "always", "python/torch/CUDA/GPU, megatron-core, TE and its FP8 support -> env.json"),
    ("install", 75, "always", "venv (--system-site-packages), the manifest's wheels offline (pip --no-index), "
                              "this checkout on PYTHONPATH, random-token bench data"),
    ("tests", 120, "always", "pytest -m gpu: CUDA codes vs numpy; TE forward/backward, TE-vs-local parity, "
                             "FP8 steps, overlap flags (skipped by pytest where TE is not importable)"),
    ("bench:binary", 50, "always", "paper-2 block, local layers, BF16: binary code"),
    ("bench:gf2", 50, "always", "paper-2 block, local layers, BF16: GF(2)-recoded code"),
    ("bench:learned", 50, "always", "paper-2 block, local layers, BF16: learned table"),
    ("bench:te", 45, "TE importable", "paper-2 block, Transformer Engine layers, BF16: binary code"),
    ("bench:te_fp8", 45, "TE FP8 supported", "as bench:te with FP8 hybrid (delayed scaling)"),
    ("report", 10, "always", "gpu_check.json + gpu_check.md"),
]


def budget(stage: str) -> int:
    return dict((s, b) for s, b, _, _ in STAGES)[stage]


def total_budget() -> int:
    return sum(b for _, b, _, _ in STAGES)


def read_manifest(path: Path = MANIFEST) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            spec, file, size = line.split()
            rows.append({"spec": spec, "file": file, "bytes": int(size)})
    return rows


def scan(wheels: Path) -> list[dict]:
    from packaging.utils import canonicalize_name, parse_wheel_filename

    rows = []
    for whl in sorted(wheels.glob("*.whl")):
        name, version, *_ = parse_wheel_filename(whl.name)
        rows.append({"spec": f"{canonicalize_name(name)}=={version}", "file": whl.name, "bytes": whl.stat().st_size})
    return rows


def write_manifest(wheels: Path, path: Path = MANIFEST) -> list[dict]:
    rows = scan(wheels)
    path.write_text("# written by scripts/download_gpu_wheels.sh: name==version  file  bytes (the wheels gpu_check.sh installs)\n"
                    + "".join(f"{r['spec']}  {r['file']}  {r['bytes']}\n" for r in rows))
    return rows


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
        lines.append(f"wheels: {wheels} is missing or empty (run scripts/download_gpu_wheels.sh where there is "
                     f"network); sizes from the manifest {manifest.name} ({len(rows)}):")
    lines += [f"  {r['spec']:<28} {r['bytes'] / 2**20:7.2f} MiB  {r['file']}" for r in rows]
    total = sum(r["bytes"] for r in rows)
    over = total > WHEELS_LIMIT_BYTES
    lines.append(f"wheels total: {mib(total)} ({total} bytes) of at most {mib(WHEELS_LIMIT_BYTES)}: "
                 + ("OVER THE LIMIT" if over else "ok"))
    ok &= not over and bool(rows)
    if not rows:
        lines.append("no wheels and no manifest: nothing to install offline")
    if present and listed:
        diff = sorted({r["spec"] for r in rows} ^ {r["spec"] for r in listed})
        if diff:
            lines.append(f"the folder and the manifest differ: {' '.join(diff)}"
                         + (" (run scripts/download_gpu_wheels.sh and commit scripts/gpu_check/wheels.txt)"))
            ok &= not strict
        else:
            lines.append("the folder matches the manifest")
    return lines, ok


def plan_lines() -> tuple[list[str], bool]:
    lines = ["plan (stage, budget = hard timeout, when, what):"]
    lines += [f"  {s:<14} {b:4d} s  {when:<17} {what}" for s, b, when, what in STAGES]
    total = total_budget()
    ok = total <= TOTAL_LIMIT_S
    lines.append(f"time budget total: {total} s of at most {TOTAL_LIMIT_S} s (8 min): "
                 + (f"ok, {TOTAL_LIMIT_S - total} s margin" if ok else "OVER THE LIMIT"))
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["show", "budget", "requirements", "wheels", "write-manifest"])
    p.add_argument("stage", nargs="?")
    p.add_argument("--wheels", type=Path, default=None)
    p.add_argument("--manifest", type=Path, default=MANIFEST)
    p.add_argument("--strict", action="store_true", help="the folder must match the manifest")
    a = p.parse_args(argv)
    if a.command == "budget":
        print(budget(a.stage))
        return 0
    if a.command == "requirements":
        print("\n".join(r["spec"] for r in read_manifest(a.manifest)))
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
