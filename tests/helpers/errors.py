"""What a refused command looks like: one error line naming what is wrong, no traceback."""

from __future__ import annotations

import subprocess


def one_line_error(capsys, *needles: str) -> str:
    """A command run in-process printed exactly one line to stderr, ``error: ...``, naming each needle."""
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


def refused(proc: subprocess.CompletedProcess, *needles: str, also_from: str | None = None) -> str:
    """A run refused as a user error: exit 2, no traceback, exactly one error line (logged `` ERROR ``
    or printed ``error:``) naming each needle; at most two more may come from the library logger
    ``also_from``. Returns the line."""
    out = (proc.stdout or "") + (proc.stderr or "")
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    errors = [line for line in out.splitlines() if " ERROR " in line or line.startswith("error:")]
    if also_from:
        assert len([line for line in errors if f" ERROR {also_from}" in line]) <= 2, errors
        errors = [line for line in errors if f" ERROR {also_from}" not in line]
    assert len(errors) == 1, errors
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]
