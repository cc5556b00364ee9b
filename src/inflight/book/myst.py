"""MyST Markdown -> the plain Markdown that Jupyter and Colab render.

The book's prose is MyST: roles (`{glue:text}` and friends), directives in backtick or colon fences
(`{exercise}`, `{solution}`, `{admonition}`, `{note}`, nested ones), targets `(label)=`, comments
`% ...` and block breaks `+++`. Jupyter and Colab show all of that as raw text, so the learner
notebooks carry this translation instead:

- an exercise becomes a bold "Exercise N (title)" line followed by its text, numbered in order of
  appearance as sphinx-exercise numbers them;
- a solution, and anything with `:class: dropdown` (or a dropdown/toggle directive), becomes a
  collapsed `<details>` block whose summary says what it hides;
- other admonitions and unknown directives become a blockquote headed by their title;
- math, code and figure directives become `$$` blocks, code fences and images; directives that mean
  nothing in a notebook (`toctree`, `bibliography`, ...) disappear;
- a glue role becomes a `{{name:spec}}` placeholder and a glue directive a `{{!name}}` line, which
  `inflight.book.glue.show_markdown` fills in from the values the notebook glued while it ran;
- other roles become their text: a reference to an exercise reads "Exercise N (title)", a
  citation `[key]`, math `$x$`, code-like roles inline code.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass, field

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,}|:{3,})(?P<info>.*)$")
DIRECTIVE_INFO = re.compile(r"^\s*\{(?P<name>[^{}\s]+)\}\s*(?P<argument>.*?)\s*$")
OPTION = re.compile(r"^\s*:(?P<key>[\w-]+):(?:\s+(?P<value>.*?))?\s*$")
ROLE_OR_CODE = re.compile(
    r"(?P<code>(?P<cticks>`+)(?:.+?)(?P=cticks))"
    r"|\{(?P<role>[A-Za-z][\w:+.-]*)\}(?P<rticks>`+)(?P<body>.+?)(?P=rticks)",
    re.DOTALL,
)
TARGET = re.compile(r"^\s*\(\s*[^()\s]+\s*\)=\s*$")
TITLED = re.compile(r"^(?P<title>.*?)\s*<(?P<target>[^<>]+)>$", re.DOTALL)

ADMONITION_TITLES = {
    "note": "Note", "tip": "Tip", "hint": "Hint", "important": "Important", "warning": "Warning",
    "caution": "Caution", "attention": "Attention", "danger": "Danger", "error": "Error",
    "seealso": "See also", "todo": "To do", "versionadded": "New in version",
    "versionchanged": "Changed in version", "deprecated": "Deprecated since version",
}
DROPPED = {"toctree", "tableofcontents", "bibliography", "index", "glossary-index", "footbibliography",
           "contents", "highlight", "default-role", "currentmodule", "rubric-end"}
CODE_DIRECTIVES = {"code", "code-block", "sourcecode", "code-cell", "literalinclude"}
CODE_ROLES = {"code", "literal", "samp", "file", "command", "envvar", "program", "option", "mimetype",
              "makevar", "regexp", "keyword", "func", "meth", "class", "mod", "attr", "obj", "data",
              "exc", "const", "type", "var", "member", "macro", "struct", "enum"}
CITE_ROLES = ("cite", "footcite")
GLUE_ROLES = {"glue", "glue:", "glue:any", "glue:text", "glue:md"}
GLUE_DIRECTIVES = {"glue", "glue:", "glue:any", "glue:figure", "glue:md", "glue:math"}


@dataclass
class Directive:
    """One directive: `{name} argument`, its `:key: value` options and its (raw MyST) body."""

    name: str
    argument: str
    options: dict[str, str]
    body: str


@dataclass
class Block:
    """A top-level piece of a Markdown text: a paragraph-like run of lines, a fenced block or a
    directive. Joined with blank lines, a text's blocks give the text back."""

    text: str
    directive: Directive | None = None


def _closes(line: str, char: str, length: int) -> bool:
    stripped = line.strip()
    return len(stripped) >= length and set(stripped) == {char}


def _fenced_end(lines: list[str], start: int, char: str, length: int, literal: bool) -> int:
    """Index of the line closing the fence opened at `start`, or len(lines).

    A code fence (`literal`) ends at the first bare fence of its character at least as long, as in
    CommonMark; a directive's body is Markdown, so fences opened inside it are skipped over.
    """
    stack: list[tuple[str, int]] = []
    for i in range(start + 1, len(lines)):
        m = FENCE.match(lines[i])
        if not m:
            continue
        c, n, info = m["fence"][0], len(m["fence"]), m["info"].strip()
        if literal:
            if c == char and n >= length and not info:
                return i
        elif stack and c == stack[-1][0] and n >= stack[-1][1] and not info:
            stack.pop()
        elif not stack and c == char and n >= length and not info:
            return i
        elif info or not stack:
            stack.append((c, n))
    return len(lines)


def _math_end(lines: list[str], start: int) -> int | None:
    """Index of the line closing a `$$` block that opens at `start` and spans lines, else None."""
    first = lines[start].strip()
    if not first.startswith("$$") or (len(first) > 2 and first.endswith("$$")):
        return None
    return next((i for i in range(start + 1, len(lines)) if lines[i].rstrip().endswith("$$")), None)


def parse_directive(header_info: str, body_lines: list[str]) -> Directive | None:
    """The directive a fence opens (its info string starts with `{name}`), or None for code."""
    m = DIRECTIVE_INFO.match(header_info)
    if not m:
        return None
    options: dict[str, str] = {}
    i = 0
    if body_lines and body_lines[0].strip() == "---":  # YAML-style options block
        end = next((j for j in range(1, len(body_lines)) if body_lines[j].strip() == "---"), None)
        if end is not None:
            for line in body_lines[1:end]:
                key, sep, value = line.partition(":")
                if sep:
                    options[key.strip()] = value.strip().strip("'\"")
            i = end + 1
    while i < len(body_lines) and (opt := OPTION.match(body_lines[i])):
        options[opt["key"]] = opt["value"] or ""
        i += 1
    body = "\n".join(body_lines[i:]).strip("\n")
    return Directive(m["name"], m["argument"], options, body)


def split_blocks(text: str) -> list[Block]:
    """The text's top-level blocks, in order (blank lines separate text blocks)."""
    lines = text.split("\n")
    blocks: list[Block] = []
    run: list[str] = []

    def flush() -> None:
        if run:
            blocks.append(Block("\n".join(run)))
            run.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        fence = FENCE.match(line)
        math_end = None if fence else _math_end(lines, i)
        if fence:
            flush()
            is_directive = DIRECTIVE_INFO.match(fence["info"]) is not None
            end = _fenced_end(lines, i, fence["fence"][0], len(fence["fence"]), literal=not is_directive)
            directive = parse_directive(fence["info"], lines[i + 1:end]) if is_directive else None
            blocks.append(Block("\n".join(lines[i:end + 1]), directive))
            i = end + 1
        elif math_end is not None:
            flush()
            blocks.append(Block("\n".join(lines[i:math_end + 1])))
            i = math_end + 1
        elif not line.strip():
            flush()
            i += 1
        else:
            run.append(line)
            i += 1
    flush()
    return blocks


@dataclass
class Exercise:
    number: int
    title: str
    label: str | None


def index_exercises(texts: list[str]) -> list[Exercise]:
    """Every exercise of a notebook's Markdown, in order, numbered as sphinx-exercise numbers them."""
    found: list[Exercise] = []

    def walk(text: str) -> None:
        for block in split_blocks(text):
            d = block.directive
            if d is None:
                continue
            if d.name in ("exercise", "exercise-start", "prf:exercise"):
                found.append(Exercise(len(found) + 1, d.argument, d.options.get("label")))
            walk(d.body)

    for text in texts:
        walk(text)
    return found


def _blockquote(title: str, body: str) -> str:
    lines = ([f"**{title}**", ""] if title else []) + (body.split("\n") if body else [])
    return "\n".join(f"> {line}" if line.strip() else ">" for line in lines)


def _summary(title: str) -> str:
    """A <summary> line: HTML, where Markdown does not apply, so inline code becomes <code>."""
    parts = re.split(r"(`+)(.+?)\1", title)
    out = []
    for i in range(0, len(parts), 3):
        out.append(html.escape(parts[i], quote=False))
        if i + 2 < len(parts):
            out.append(f"<code>{html.escape(parts[i + 2], quote=False)}</code>")
    return "".join(out)


def _details(summary: str, body: str) -> str:
    return f"<details>\n<summary>{_summary(summary)}</summary>\n\n{body}\n\n</details>"


@dataclass
class Converter:
    """Converts one notebook's MyST Markdown, cell by cell, in order (exercise numbers run on)."""

    exercises: list[Exercise] = field(default_factory=list)
    _next_exercise: int = 0

    def _exercise_by_label(self, label: str) -> Exercise | None:
        return next((e for e in self.exercises if e.label == label), None)

    def convert(self, text: str) -> str:
        """The text in plain Markdown (glue roles as `{{name:spec}}` placeholders)."""
        return "\n\n".join(out for b in split_blocks(text) if (out := self.convert_block(b)))

    def convert_block(self, block: Block) -> str:
        if block.directive is not None:
            return self.directive(block.directive)
        lines = block.text.split("\n")
        first = lines[0].lstrip()
        if first.startswith("```") or first.startswith("~~~") or first.startswith("$$"):
            return block.text  # code and math: literal
        kept = [ln for ln in lines
                if not TARGET.match(ln) and not ln.startswith("%") and not ln.strip().startswith("+++")]
        return self.inline("\n".join(kept)) if kept else ""

    def inline(self, text: str) -> str:
        """Roles replaced by their plain-Markdown text; inline code left alone."""
        def one(m: re.Match) -> str:
            return m["code"] if m["code"] else self.role(m["role"], m["body"])

        return ROLE_OR_CODE.sub(one, text)

    def _ref_text(self, body: str, numbered: bool) -> str:
        m = TITLED.match(body.strip())
        title, target = (m["title"], m["target"]) if m else ("", body.strip())
        target = target.lstrip("~!").split("::")[-1]
        exercise = self._exercise_by_label(target.lstrip("#"))
        if exercise is not None:
            number = f"Exercise {exercise.number}"
            if title:
                return title.replace("{number}", str(exercise.number)).replace("%s", str(exercise.number))
            return number if numbered else f"{number} ({exercise.title})" if exercise.title else number
        if title:
            return re.sub(r"\{number\}|%s|\{name\}", "", title).strip()
        return target

    def role(self, name: str, body: str) -> str:
        if name in GLUE_ROLES:
            return "{{" + body.strip() + "}}"
        base = name.split(":")[-1] if name.startswith(("py:", "std:", "c:", "cpp:", "js:")) else name
        if name == "math":
            return f"${body}$"
        if name in ("sub", "subscript"):
            return f"<sub>{body}</sub>"
        if name in ("sup", "superscript"):
            return f"<sup>{body}</sup>"
        if name == "kbd":
            return f"<kbd>{body}</kbd>"
        if name in ("emphasis", "dfn"):
            return f"*{body}*"
        if name == "strong":
            return f"**{body}**"
        if name.startswith(CITE_ROLES):
            return "[" + "; ".join(k.strip() for k in body.split(",")) + "]"
        if base in CODE_ROLES:
            m = TITLED.match(body.strip())
            return f"`{(m['title'] or m['target']) if m else body.strip().lstrip('~!')}`"
        if name in ("numref", "prf:ref") or name.endswith(":numref"):
            return self._ref_text(body, numbered=True)
        return self._ref_text(body, numbered=False)

    def directive(self, d: Directive) -> str:
        name = d.name.split(":", 1)[1] if d.name.startswith("prf:") else d.name
        classes = d.options.get("class", "").split()
        if d.name in GLUE_DIRECTIVES:
            caption = self.convert(d.body)
            return "{{!" + d.argument.strip() + "}}" + (f"\n\n*{caption}*" if caption else "")
        if name in DROPPED:
            return ""
        if name in ("exercise", "exercise-start"):
            return self.exercise(d)
        if name in ("exercise-end", "solution-end"):
            return "</details>" if name == "solution-end" else ""
        if name in ("solution", "solution-start"):
            return self.solution(d)
        if name == "math":
            return f"$$\n{d.body}\n$$"
        if name in CODE_DIRECTIVES:
            return f"```{d.argument or d.options.get('language', '')}\n{d.body}\n```"
        if name in ("figure", "image"):
            alt = d.options.get("alt", "")
            caption = self.convert(d.body) if name == "figure" else ""
            return f"![{alt}]({d.argument})" + (f"\n\n*{caption}*" if caption else "")
        if name == "raw":
            return d.body if "html" in d.argument else ""
        if name == "only":
            return self.convert(d.body) if "html" in d.argument else ""
        title = self.inline(d.argument) or ADMONITION_TITLES.get(name, "") or name.replace("-", " ").capitalize()
        body = self.convert(d.body)
        if "dropdown" in classes or name in ("dropdown", "toggle", "details"):
            return _details(title, body)
        return _blockquote(title, body)

    def exercise(self, d: Directive) -> str:
        if self._next_exercise < len(self.exercises):
            number = self.exercises[self._next_exercise].number
        else:
            number = self._next_exercise + 1
        self._next_exercise += 1
        label = "Exercise" if "nonumber" in d.options else f"Exercise {number}"
        heading = f"**{label} ({self.inline(d.argument)})**" if d.argument else f"**{label}**"
        body = self.convert(d.body)
        return f"{heading}\n\n{body}" if body else heading

    def solution(self, d: Directive) -> str:
        exercise = self._exercise_by_label(d.argument.strip())
        if exercise is None:
            summary = "Solution"
        else:
            summary = f"Solution to Exercise {exercise.number}" + (f" ({exercise.title})" if exercise.title else "")
        if d.name == "solution-start":
            return f"<details>\n<summary>{_summary(summary)}</summary>"
        return _details(summary, self.convert(d.body))


RAW_ROLE = re.compile(r"\{[A-Za-z][\w:+.-]*\}`")
RAW_FENCE = re.compile(r"^[ \t]*(?:`{3,}|~{3,}|:{3,})[ \t]*\{", re.MULTILINE)


def count_raw_myst(markdown: str) -> int:
    """How many MyST-only constructs (roles, directive fences, targets) a Markdown text still holds."""
    targets = sum(1 for line in markdown.split("\n") if TARGET.match(line))
    return len(RAW_ROLE.findall(markdown)) + len(RAW_FENCE.findall(markdown)) + targets
