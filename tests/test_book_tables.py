"""The chapters' Markdown tables: one row per line, numbers formatted and right-aligned, and a row of
the wrong length refused."""
import pytest

from inflight.book.tables import markdown_table


def test_markdown_table_formats_and_aligns():
    text = markdown_table(["name", "value"], [("a|b", 1.2345), ("c", None)], formats=[None, ".2f"])
    lines = text.splitlines()
    assert lines[0] == "| name | value |"
    assert lines[1] == "| :--- | ---: |"
    assert lines[2] == "| a\\|b | 1.23 |"
    assert lines[3] == "| c | – |"


def test_markdown_table_refuses_ragged_rows():
    with pytest.raises(ValueError, match="one value per column"):
        markdown_table(["a", "b"], [(1,)])
