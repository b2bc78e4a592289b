"""A document for a reader, one type per kind of block, rendered twice: Markdown and one
self-contained HTML page (no script, no external resource). Students' feedback and the class
report are made of these; everything in a block is text, escaped by each renderer.
"""

from __future__ import annotations

import html as html_lib
import re
from dataclasses import dataclass, field
from enum import Enum


class Tone(str, Enum):
    """How a block is shown (its CSS class): a result's state, or a note's kind."""

    NONE = ""
    PASSED = "passed"
    FAILED = "failed"
    PARTIAL = "partial"
    NOT_EVALUATED = "not evaluated"
    EXCUSED = "excused"
    """Failed through a bug charged to an earlier item: its points kept."""
    HINT = "hint"
    """A note the reader may act on: the likely bug, a warning."""
    BAD = "bad"
    """A note that something stopped the grading."""


@dataclass(frozen=True)
class Heading:
    level: int
    text: str
    tone: Tone = Tone.NONE


@dataclass(frozen=True)
class Paragraph:
    text: str
    tone: Tone = Tone.NONE


@dataclass(frozen=True)
class ReportNote:
    """A boxed remark."""

    text: str
    tone: Tone = Tone.HINT


@dataclass(frozen=True)
class Facts:
    """Labelled facts (a definition list): ``(label, value)`` pairs."""

    pairs: list[list[str]]


@dataclass(frozen=True)
class Bullets:
    items: list[str]


@dataclass(frozen=True)
class Preformatted:
    text: str


@dataclass(frozen=True)
class Image:
    source: str
    description: str


@dataclass(frozen=True)
class Table:
    """A header row, then rows; ``row_tones`` one per row where rows are coloured by state;
    ``items``: the rubric items' layout (fixed columns)."""

    rows: list[list[str]]
    row_tones: list[str] = field(default_factory=list)
    items: bool = False


Block = Heading | Paragraph | ReportNote | Facts | Bullets | Preformatted | Image | Table
"""A block of a document."""


def css_class(tone: Tone | str) -> str:
    return str(getattr(tone, "value", tone)).replace(" ", "-")


# Markdown.

_MD_SPECIAL = re.compile(r"([\\`*<>\[\]])")


def md_escape(text: str) -> str:
    """Text safe in Markdown: no emphasis, code, links or HTML from a submission's messages.
    Underscores inside words (``d_model``) are left: they never start emphasis."""
    text = _MD_SPECIAL.sub(r"\\\1", text)
    return re.sub(r"(?<!\w)_|_(?!\w)", r"\\_", text)


def _md_cell(text: str) -> str:
    return md_escape(text).replace("|", "\\|").replace("\n", " ")


def _fence(text: str) -> str:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text.rstrip()}\n{fence}"


def render_markdown(blocks: list[Block]) -> str:
    out: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            out.append("#" * block.level + " " + md_escape(block.text))
        elif isinstance(block, Paragraph):
            out.append(md_escape(block.text))
        elif isinstance(block, ReportNote):
            out.append("> " + md_escape(block.text).replace("\n", "\n> "))
        elif isinstance(block, Facts):
            out.append("\n".join(f"- **{md_escape(k)}:** {md_escape(v)}"
                                 for k, v in block.pairs))
        elif isinstance(block, Bullets):
            out.append("\n".join(f"- {md_escape(item)}" for item in block.items))
        elif isinstance(block, Preformatted):
            out.append(_fence(block.text))
        elif isinstance(block, Image):
            out.append(f"![{md_escape(block.description)}]({block.source})")
        elif isinstance(block, Table):
            header, *rows = block.rows
            lines = ["| " + " | ".join(_md_cell(c) for c in header) + " |",
                     "|" + "|".join(" --- " for _ in header) + "|"]
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
            out.append("\n".join(lines))
    return "\n\n".join(out) + "\n"



# HTML.

_CSS = """
body { font: 15px/1.5 -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
       color: #1f2328; max-width: 860px; margin: 2em auto; padding: 0 1.2em; }
h1 { font-size: 1.6em; border-bottom: 1px solid #d0d7de; padding-bottom: .3em; }
h2 { font-size: 1.25em; margin-top: 1.8em; border-bottom: 1px solid #eaeef2; padding-bottom: .2em; }
h3 { font-size: 1.05em; margin-top: 1.4em; }
h3.failed, h3.not-evaluated { color: #a40e26; } h3.partial { color: #9a6700; } h3.excused { color: #57606a; }
dl.meta { display: grid; grid-template-columns: max-content auto; gap: .2em 1em; }
dl.meta dt { font-weight: 600; color: #57606a; } dl.meta dd { margin: 0; }
table { border-collapse: collapse; width: 100%; margin: .8em 0; }
th, td { border: 1px solid #d0d7de; padding: .35em .7em; text-align: left; }
th { background: #f6f8fa; }
table.items { table-layout: fixed; }
table.items th:nth-child(1) { width: 58%; } table.items th:nth-child(2) { width: 27%; }
table.items td:last-child, table.items th:last-child { text-align: right; white-space: nowrap; }
tr.passed td:nth-child(2) { color: #1a7f37; font-weight: 600; }
tr.failed td:nth-child(2) { color: #cf222e; font-weight: 600; }
tr.partial td:nth-child(2) { color: #9a6700; font-weight: 600; }
tr.excused td:nth-child(2) { color: #57606a; }
tr.not-evaluated td:nth-child(2), tr.pending td:nth-child(2) { color: #57606a; font-style: italic; }
p.passed { color: #1a7f37; } p.failed { color: #cf222e; } p.not-evaluated { color: #57606a; }
.note { border-left: 4px solid #d0d7de; background: #f6f8fa; padding: .5em .9em; margin: .8em 0; }
.note.bad { border-color: #cf222e; background: #fff1f0; }
.note.hint { border-color: #bf8700; background: #fff8c5; }
pre { background: #f6f8fa; border: 1px solid #d0d7de; border-radius: 6px; padding: .7em;
      overflow-x: auto; white-space: pre-wrap; word-break: break-word; font-size: 13px; }
ul { padding-left: 1.4em; } li { margin: .15em 0; }
""".strip()


def render_html(blocks: list[Block], title: str) -> str:
    e = html_lib.escape
    body: list[str] = []
    for block in blocks:
        tone = getattr(block, "tone", Tone.NONE)
        css = f' class="{e(css_class(tone))}"' if tone is not Tone.NONE else ""
        if isinstance(block, Heading):
            body.append(f"<h{block.level}{css}>{e(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            body.append(f"<p{css}>{e(block.text)}</p>")
        elif isinstance(block, ReportNote):
            body.append(f'<div class="note {e(css_class(block.tone))}">{e(block.text)}</div>')
        elif isinstance(block, Facts):
            body.append('<dl class="meta">' + "".join(
                f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in block.pairs) + "</dl>")
        elif isinstance(block, Bullets):
            body.append("<ul>" + "".join(f"<li>{e(i)}</li>" for i in block.items) + "</ul>")
        elif isinstance(block, Preformatted):
            body.append(f"<pre>{e(block.text)}</pre>")
        elif isinstance(block, Image):
            body.append(f'<p><img src="{e(block.source)}" alt="{e(block.description)}" '
                        'style="max-width:100%"></p>')
        elif isinstance(block, Table):
            header, *rows = block.rows
            table_css = ' class="items"' if block.items else ""
            lines = [f"<table{table_css}><thead><tr>"
                     + "".join(f"<th>{e(c)}</th>" for c in header) + "</tr></thead><tbody>"]
            for row, css in zip(rows, block.row_tones or [""] * len(rows), strict=True):
                lines.append(f'<tr class="{e(css)}">' + "".join(f"<td>{e(c)}</td>" for c in row)
                             + "</tr>")
            lines.append("</tbody></table>")
            body.append("".join(lines))
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{e(title)}</title>\n<style>\n{_CSS}\n</style>\n</head>\n<body>\n"
            + "\n".join(body) + "\n</body>\n</html>\n")


