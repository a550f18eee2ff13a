"""docs/flags.md is generated from the parser and its tables and is current."""

from __future__ import annotations

from megatron_fixedcode.arguments.flag_table import GENERATED, flag_table_markdown
from tests.helpers import REPO


def test_docs_flag_table_is_current(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    page = (REPO / "docs" / "flags.md").read_text()
    assert page.startswith(GENERATED)
    assert page == flag_table_markdown(), (
        "regenerate: python -m megatron_fixedcode.arguments.flag_table > docs/flags.md"
    )


def test_every_flag_is_in_the_table():
    from megatron_fixedcode.arguments.core_flags import build_parser

    page = flag_table_markdown()
    assert all(f"`{o}`" in page for a in build_parser()._actions for o in a.option_strings if o not in ("-h", "--help"))
