"""The chapters' result tables: numbers formatted and right-aligned, HTML escaped, Markdown for plain
text, and a row of the wrong length refused."""
import pytest

from inflight.book.tables import Table, markdown_table


def test_markdown_table_formats_and_aligns():
    text = markdown_table(["name", "value"], [("a|b", 1.2345), ("c", None)], formats=[None, ".2f"])
    lines = text.splitlines()
    assert lines[0] == "| name | value |"
    assert lines[1] == "| :--- | ---: |"
    assert lines[2] == "| a\\|b | 1.23 |"
    assert lines[3] == "| c | – |"


def test_table_renders_html_for_the_website_and_escapes_it():
    html = Table(["op", "ms"], [("a<b", 2.0)], formats=[None, ".1f"])._repr_html_()
    assert html.startswith("<table") and "a&lt;b" in html and ">2.0<" in html
    assert 'style="text-align: right"' in html


def test_tables_refuse_ragged_rows_and_bad_alignment():
    with pytest.raises(ValueError, match="one value per column"):
        markdown_table(["a", "b"], [(1,)])
    with pytest.raises(ValueError, match="align"):
        Table(["a", "b"], [(1, 2)], align="lx")
