"""What a refused command looks like: one error line naming what is wrong, no traceback."""

from __future__ import annotations

import subprocess


def logged_errors(out: str, logger: str = "") -> list[str]:
    """The ERROR records in a log, as Megatron-LM's runs write them (``ERROR:logger.name:message``), from
    ``logger`` (a name prefix) when given."""
    return [line for line in out.splitlines() if line.startswith(f"ERROR:{logger}")]


def message_of(line: str) -> str:
    """A record's message: what follows ``LEVEL:logger.name:``."""
    return line.split(":", 2)[2]


def one_line_error(capsys, *needles: str) -> str:
    """A command run in-process printed exactly one line to stderr, ``error: ...``, naming each needle."""
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


def refused(proc: subprocess.CompletedProcess, *needles: str, also_from: str | None = None) -> str:
    """A run refused as a user error: exit 2, no traceback, exactly one error line (logged ``ERROR:...``
    or printed ``error:``) naming each needle; at most two more may come from the library logger
    ``also_from``. Returns the line."""
    out = (proc.stdout or "") + (proc.stderr or "")
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith(("ERROR:", "error:"))]
    if also_from:
        assert len(logged_errors(out, also_from)) <= 2, errors
        errors = [line for line in errors if not line.startswith(f"ERROR:{also_from}")]
    assert len(errors) == 1, errors
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def parse_refused(argv: list[str], capsys) -> str:
    """The trainer's parser refused ``argv`` (exit 2); what it printed on stderr."""
    import pytest

    from megatron_fixedcode.arguments.parse import parse_pretrain_args

    with pytest.raises(SystemExit) as e:
        parse_pretrain_args(argv)
    assert e.value.code == 2
    return capsys.readouterr().err
