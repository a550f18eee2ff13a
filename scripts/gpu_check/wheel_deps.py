"""Requirements of the wheels in a folder that no wheel there provides (torch, triton and CUDA runtime
packages excluded: the GPU machine's own torch provides them). download_gpu_wheels.sh downloads
these with `pip download --no-deps` until nothing is missing.

    python scripts/gpu_check/wheel_deps.py WHEELS_DIR [--python-version 3.12]
"""

from __future__ import annotations

import argparse
import re
import sys
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

PROVIDED_BY_THE_MACHINE = re.compile(r"^(torch|triton|nvidia-.*|pytorch-triton.*)$")


def missing(wheels: Path, python_version: str) -> list[str]:
    have, wanted = set(), {}
    env = {
        **default_environment(),
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "extra": "",
    }
    for whl in sorted(wheels.glob("*.whl")):
        name, *_ = parse_wheel_filename(whl.name)
        have.add(canonicalize_name(name))
        with zipfile.ZipFile(whl) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            for line in z.read(meta).decode().splitlines():
                if line.startswith("Requires-Dist:"):
                    req = Requirement(line.split(":", 1)[1].strip())
                    if req.marker is None or req.marker.evaluate(env):
                        wanted.setdefault(canonicalize_name(req.name), str(req).split(";")[0].strip())
    return sorted(spec for name, spec in wanted.items() if name not in have and not PROVIDED_BY_THE_MACHINE.match(name))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("wheels")
    p.add_argument("--python-version", default="3.12")
    a = p.parse_args(argv)
    print("\n".join(missing(Path(a.wheels), a.python_version)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
