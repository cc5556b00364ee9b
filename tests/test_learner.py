"""The learner's path, piece by piece: MyST -> plain Markdown, glue outside the book, and the
learner notebook's text cells, stubs and pasted solutions."""
import pytest

from inflight.book import glue, make_learner, myst


def convert(text: str) -> str:
    return myst.Converter(myst.index_exercises([text])).convert(text)


# --- MyST -> Markdown -------------------------------------------------------------------------

EXERCISES = """\
## More exercises

```{exercise} The ridge of an H100
:label: ex-h100

At what batch size? See {ref}`ex-int8` and {numref}`ex-h100`.
```

```{solution} ex-h100
:class: dropdown

$B^\\ast \\approx 295$, using {glue:text}`ridge:.0f`.
```

:::{exercise} An int8 KV cache
:label: ex-int8
Half the bytes.
:::

```{solution} ex-int8
:class: dropdown
Twice as many.
```
"""


def test_exercises_and_solutions():
    out = convert(EXERCISES)
    assert "**Exercise 1 (The ridge of an H100)**" in out
    assert "**Exercise 2 (An int8 KV cache)**" in out
    assert "<details>\n<summary>Solution to Exercise 1 (The ridge of an H100)</summary>" in out
    assert "<summary>Solution to Exercise 2 (An int8 KV cache)</summary>\n\nTwice as many.\n\n</details>" in out
    assert "See Exercise 2 (An int8 KV cache) and Exercise 1." in out
    assert "{{ridge:.0f}}" in out
    assert myst.count_raw_myst(EXERCISES) == 7 and myst.count_raw_myst(out) == 0


def test_admonitions_dropdowns_and_notes():
    src = ('```{admonition} "Why?"\n:class: dropdown\n\nBecause `x` is {glue:text}`n`.\n```\n\n'
           '```{note}\nPlain note.\n```\n\n'
           '```{warning} Careful with `y`\n:class: tip\nHot.\n```')
    out = convert(src)
    assert '<details>\n<summary>"Why?"</summary>\n\nBecause `x` is {{n}}.\n\n</details>' in out
    assert "> **Note**\n>\n> Plain note." in out
    assert "> **Careful with `y`**\n>\n> Hot." in out
    assert myst.count_raw_myst(out) == 0


def test_nested_directives_with_code_inside():
    src = ("````{admonition} Outer\n:class: dropdown\n\n"
           "```{note}\nInner {term}`KV cache`.\n```\n\n"
           "```python\nx = {'a': 1}  # {not a role}`\n```\n````\n\nAfter.")
    out = convert(src)
    assert out.startswith("<details>\n<summary>Outer</summary>")
    assert "> **Note**\n>\n> Inner KV cache." in out
    assert "```python\nx = {'a': 1}  # {not a role}`\n```" in out  # code stays literal
    assert out.endswith("</details>\n\nAfter.")


def test_colon_fences_nest_too():
    src = "::::{tip} Outer\n:::{seealso}\nInner\n:::\n::::"
    out = convert(src)
    assert out == "> **Outer**\n>\n> > **See also**\n> >\n> > Inner"


@pytest.mark.parametrize("role, want", [
    ("{cite}`kwon2023, yu2022`", "[kwon2023; yu2022]"),
    ("{cite:p}`kwon2023`", "[kwon2023]"),
    ("{math}`a^2`", "$a^2$"),
    ("{ref}`the loop <sec-loop>`", "the loop"),
    ("{ref}`sec-loop`", "sec-loop"),
    ("{doc}`../intro`", "../intro"),
    ("{term}`continuous batching`", "continuous batching"),
    ("{py:func}`inflight.simulate`", "`inflight.simulate`"),
    ("{sub}`2`", "<sub>2</sub>"),
    ("{kbd}`Ctrl`", "<kbd>Ctrl</kbd>"),
    ("{abbr}`KV (key-value)`", "KV (key-value)"),
    ("{glue:text}`a_b:,.2f`", "{{a_b:,.2f}}"),
    ("{glue}`x`", "{{x}}"),
    ("{someext:role}`anything`", "anything"),
])
def test_roles(role, want):
    assert convert(f"Before {role} after.") == f"Before {want} after."


def test_roles_inside_inline_code_are_left_alone():
    src = "Write `{glue:text}` roles like ``{glue:text}`name` ``."
    assert convert(src) == src


def test_targets_comments_and_block_breaks_disappear():
    src = "(sec-loop)=\n## The loop\n% a comment\nText.\n\n+++\n\nMore."
    assert convert(src) == "## The loop\nText.\n\nMore."


def test_other_directives():
    out = convert("```{math}\n:label: eq1\na = b\n```\n\n```{code-block} python\nx = 1\n```\n\n"
                  "```{figure} fig.png\n:alt: A plot\n\nThe caption.\n```\n\n```{toctree}\nchapters/a\n```\n\n"
                  "```{glue:figure} ch_fig\n:figwidth: 80%\n\nCaption {glue:text}`n`.\n```\n\n"
                  "```{mystery-thing} Title\nBody.\n```")
    assert "$$\na = b\n$$" in out
    assert "```python\nx = 1\n```" in out
    assert "![A plot](fig.png)\n\n*The caption.*" in out
    assert "chapters/a" not in out
    assert "{{!ch_fig}}\n\n*Caption {{n}}.*" in out
    assert "> **Title**\n>\n> Body." in out
    assert myst.count_raw_myst(out) == 0


def test_math_blocks_are_literal():
    src = "$$\n\\frac{a}{b} % not a comment\n$$\n\n$$x$$"
    assert convert(src) == src


def test_split_blocks_round_trips():
    blocks = myst.split_blocks(EXERCISES)
    assert "\n\n".join(b.text for b in blocks) == EXERCISES.strip("\n")
    assert [b.directive.name for b in blocks if b.directive] == ["exercise", "solution", "exercise", "solution"]


def test_count_raw_myst():
    assert myst.count_raw_myst("{glue:text}`a` and {cite}`b`\n```{note}\nx\n```\n:::{tip}\ny\n:::\n(lbl)=") == 5
    assert myst.count_raw_myst("`code` and {braces} and ```python") == 0


# --- glue ---------------------------------------------------------------------------------------

def test_format_text_matches_myst_nb():
    variables = pytest.importorskip("myst_nb.core.variables")
    for value in [3.14159, 2, 1234567, 0.25, "text", True, 1e-5, float("nan")]:
        for spec in [".2f", ",", ".0f", ".1%", "s", "", ".3g", ",.0f"]:
            text = glue._plain_text(value)
            try:
                want = variables.format_plain_text(text, spec)
            except (TypeError, ValueError):
                with pytest.raises((TypeError, ValueError)):
                    glue.format_text(text, spec)
                continue
            assert glue.format_text(text, spec) == want, (value, spec)


def test_glue_records_and_fill_formats(monkeypatch):
    monkeypatch.setattr(glue, "GLUED", {})
    glue.glue("speed", 1234.5678, display=False)

    class Say:
        def __repr__(self):
            return "3.2×"

    glue.glue("ratio", Say(), display=False)
    text, missing = glue.fill("{{speed:,.1f}} tok/s, {{ratio}} faster, {{later:.2f}} ms", glue.GLUED)
    assert text == f"1,234.6 tok/s, 3.2× faster, {glue.UNKNOWN} ms"
    assert missing == ["later"]


def test_glue_without_myst_nb_displays_when_asked(monkeypatch, capsys):
    monkeypatch.setattr(glue, "GLUED", {})
    monkeypatch.setattr(glue, "_myst_nb_glue", lambda: None)
    shown = []
    monkeypatch.setattr(glue, "_display", shown.append)
    glue.glue("a", 1, display=False)
    glue.glue("b", 2)
    assert shown == [2] and set(glue.GLUED) == {"a", "b"}
    with pytest.raises(TypeError):
        glue.glue("", 3)


def test_render_pieces_and_unknown_note():
    known = {"n": glue.Glued(7, "7"), "fig": glue.Glued(object(), "<obj>")}
    pieces = glue.render("We saw {{n}} steps.\n{{!fig}}\nThen {{m:.1f}}.\n", known)
    assert pieces[0] == ("markdown", "We saw 7 steps.\n")
    assert pieces[1] == ("object", known["fig"].value)
    assert pieces[2] == ("markdown", f"Then {glue.UNKNOWN}.")
    assert pieces[3] == ("markdown", glue.UNKNOWN_NOTE.format(mark=glue.UNKNOWN))
    assert glue.render("No numbers.", {}) == [("markdown", "No numbers.")]
    assert glue.render("{{m}}", {}, note=None) == [("markdown", glue.UNKNOWN)]


# --- make_learner -------------------------------------------------------------------------------

def _nb(*cells):
    out = []
    for kind, source, *meta in cells:
        cell = {"cell_type": kind, "metadata": meta[0] if meta else {}, "source": source}
        if kind == "code":
            cell.update(outputs=[{"output_type": "stream", "name": "stdout", "text": "x"}], execution_count=3)
        out.append(cell)
    return {"cells": out, "metadata": {}, "nbformat": 4, "nbformat_minor": 4}


CHAPTER = _nb(
    ("code", "import inflight", {"tags": ["hide-input"]}),
    ("markdown", "## Title\n\nStatic text.\n\nWe measured {glue:text}`speed:.1f` tok/s.\n\nMore static text."),
    ("code", "def f(x):\n    # Hint: double it\n    ### BEGIN SOLUTION\n    y = 2 * x\n    return y\n    ### END SOLUTION"),
    ("code", "result = check(f)\nf = use_if_passed(result, f, ref)"),
    ("markdown", EXERCISES),
)


def test_learner_notebook_shape():
    nb = make_learner.learner_notebook(CHAPTER)
    kinds = [("text" if make_learner.is_text_cell(c) else c["cell_type"]) for c in nb["cells"]]
    assert kinds == ["code", "markdown", "text", "markdown", "code", "code",
                     "markdown", "text", "markdown"]
    assert nb["cells"][0]["metadata"]["jupyter"] == {"source_hidden": True}
    assert nb["cells"][1]["source"] == "## Title\n\nStatic text."
    assert all(c.get("outputs", []) == [] for c in nb["cells"] if c["cell_type"] == "code"
               and not make_learner.is_text_cell(c))
    assert "return y" not in nb["cells"][4]["source"] and make_learner.STUB in nb["cells"][4]["source"]
    assert CHAPTER["cells"][2]["outputs"], "the input notebook must stay untouched"


def test_text_cell_runs_and_its_prewritten_output_reads(monkeypatch):
    cell = make_learner.learner_notebook(CHAPTER)["cells"][2]
    assert cell["metadata"]["cellView"] == "form" and cell["source"].startswith("# @title ")
    shown = [o["data"]["text/markdown"] for o in cell["outputs"]]
    assert shown == [f"We measured {glue.UNKNOWN} tok/s.\n\n" + glue.NOT_RUN_NOTE.format(mark=glue.UNKNOWN)]
    later = make_learner.learner_notebook(CHAPTER)["cells"][7]  # the notebook's second text cell
    assert make_learner.is_text_cell(later)
    assert glue.NOT_RUN_NOTE.format(mark=glue.UNKNOWN) not in later["outputs"][0]["data"]["text/markdown"]
    displayed = []
    monkeypatch.setattr(glue, "GLUED", {"speed": glue.Glued(12.345, "12.345")})
    import IPython.display
    monkeypatch.setattr(IPython.display, "display", lambda obj, **kw: displayed.append(obj.data))
    exec(compile(cell["source"], "<text cell>", "exec"), {})
    assert displayed == ["We measured 12.3 tok/s."]


def test_a_text_shown_before_its_number_is_redrawn_when_it_is_glued(monkeypatch):
    class Handle:
        def __init__(self, obj):
            self.shown = [obj.data]

        def update(self, obj):
            self.shown.append(obj.data)

    handles = []
    import IPython.display
    monkeypatch.setattr(IPython.display, "display", lambda obj, **kw: handles.append(Handle(obj)) or handles[-1])
    monkeypatch.setattr(glue, "GLUED", {})
    monkeypatch.setattr(glue, "_WAITING", [])
    monkeypatch.setattr(glue, "_myst_nb_glue", lambda: None)
    glue.glue("a", 1, display=False)
    glue.show_markdown("{{a}} then {{b:.1f}} and {{c}}")
    assert handles[0].shown == [f"1 then {glue.UNKNOWN} and {glue.UNKNOWN}\n\n" + glue.UNKNOWN_NOTE.format(mark=glue.UNKNOWN)]
    glue.glue("b", 2.25, display=False)
    glue.glue("c", "x", display=False)
    assert handles[0].shown[1:] == [f"1 then 2.2 and {glue.UNKNOWN}\n\n" + glue.UNKNOWN_NOTE.format(mark=glue.UNKNOWN),
                                    "1 then 2.2 and x"]
    assert glue._WAITING == []


def test_text_cell_survives_triple_quotes_and_backslashes():
    for text in ['He said """hi""" {{x}}', "Ends with a backslash \\ {{x}}", "$\\frac{a}{b}$ {{x}}"]:
        source = make_learner.text_cell(text)["source"]
        namespace = {}
        exec(compile(source.replace("show_markdown(", "captured = ("), "<cell>", "exec"), namespace)
        assert namespace["captured"].strip("\n") == text


def test_paste_solutions_restores_the_reference():
    learner = make_learner.learner_notebook(CHAPTER)
    pasted = make_learner.paste_solutions(learner, CHAPTER)
    code = [c["source"] for c in pasted["cells"] if c["cell_type"] == "code" and not make_learner.is_text_cell(c)]
    assert code[1] == "def f(x):\n    # Hint: double it\n    y = 2 * x\n    return y"
    assert make_learner.STUB not in "".join(code)
    with pytest.raises(ValueError):
        make_learner.paste_solutions(learner, _nb(("code", "x = 1")))


def test_strip_solutions_rejects_unbalanced_markers():
    with pytest.raises(ValueError):
        make_learner.strip_solutions("### BEGIN SOLUTION\nx = 1\n")
    with pytest.raises(ValueError):
        make_learner.strip_solutions("x = 1\n### END SOLUTION\n")
