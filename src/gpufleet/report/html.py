"""Assembly of self-contained HTML pages: a minimal stylesheet, tables, sections and embedded figures.

Everything is escaped here, so callers pass plain strings; figures carry plotly.js inline at most
once per page (the first figure), so a report opens offline and stays a few MB. Pages fit a 1,280 px
window: long text cells wrap, and figure grids keep their column widths fixed from the first figure on
(``auto-fill``), so a figure drawn before its neighbours arrive is never wider than its cell.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from html import escape
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["CSS", "figure_div", "grid", "kv_table", "page", "section", "table"]

CSS = """
:root { --fg: #1f2328; --muted: #59636e; --line: #d1d9e0; --bg-alt: #f6f8fa; --best: #1a7f37; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
       margin: 0 auto; padding: 24px 32px 48px; max-width: 1400px; }
h1 { font-size: 24px; margin: 0 0 12px; }
h2 { font-size: 18px; margin: 32px 0 8px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
h3 { font-size: 15px; margin: 16px 0 4px; }
p.note { color: var(--muted); margin: 4px 0 12px; }
table { border-collapse: collapse; margin: 8px 0 16px; font-variant-numeric: tabular-nums; }
th, td { padding: 4px 10px; border-bottom: 1px solid var(--line); text-align: right; white-space: nowrap; }
th { background: var(--bg-alt); font-weight: 600; white-space: normal; vertical-align: bottom; }
th:first-child, td:first-child { text-align: left; }
td.text, th.text { text-align: left; white-space: normal; overflow-wrap: anywhere; min-width: 6em; }
table.kv td:first-child { color: var(--muted); white-space: nowrap; }
table.kv td { text-align: left; white-space: normal; overflow-wrap: anywhere; }
td.best { color: var(--best); font-weight: 600; }
.scroll { overflow-x: auto; max-width: 100%; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(min(100%, 540px), 1fr)); gap: 16px; }
.fig { min-width: 0; }
footer { margin-top: 40px; color: var(--muted); font-size: 12px; }
"""


def table(
    header: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    cell_classes: Iterable[Sequence[str]] | None = None,
    css_class: str = "",
    text_columns: Collection[int] = (),
) -> str:
    """An HTML table of already-formatted strings; ``cell_classes`` (same shape as rows) styles cells.

    ``text_columns`` (indices) hold free text: left-aligned and wrapped, so a long cell does not widen
    the table past the page.
    """
    rows = list(rows)
    classes = list(cell_classes) if cell_classes is not None else [[""] * len(r) for r in rows]
    head = "".join(
        f'<th class="text">{escape(h)}</th>' if j in text_columns else f"<th>{escape(h)}</th>"
        for j, h in enumerate(header)
    )
    body = []
    for row, cls in zip(rows, classes, strict=True):
        tds = []
        for j, (v, c) in enumerate(zip(row, cls, strict=True)):
            names = " ".join(n for n in (c, "text" if j in text_columns else "") if n)
            tds.append(f'<td class="{escape(names)}">{escape(v)}</td>' if names else f"<td>{escape(v)}</td>")
        cells = "".join(tds)
        body.append(f"<tr>{cells}</tr>")
    attr = f' class="{escape(css_class)}"' if css_class else ""
    return (
        f'<div class="scroll"><table{attr}><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'
    )


def kv_table(items: Mapping[str, object]) -> str:
    """A two-column key/value table (run context: trace, cluster, options)."""
    rows = "".join(f"<tr><td>{escape(str(k))}</td><td>{escape(str(v))}</td></tr>" for k, v in items.items())
    return f'<table class="kv"><tbody>{rows}</tbody></table>'


def section(heading: str, *parts: str, note: str = "") -> str:
    """A titled section of already-built HTML parts, with an optional one-line explanation."""
    note_html = f'<p class="note">{escape(note)}</p>' if note else ""
    return f"<section><h2>{escape(heading)}</h2>{note_html}{''.join(parts)}</section>"


def grid(*parts: str) -> str:
    """Figures side by side, as many per row as fit at 540 px or more each (one on a narrow window)."""
    return f'<div class="grid">{"".join(parts)}</div>'


def figure_div(fig: go.Figure, *, div_id: str, include_plotlyjs: bool, height: str = "440px") -> str:
    """A figure as an HTML fragment; ``include_plotlyjs`` inlines the plotly.js bundle (first figure only)."""
    html = fig.to_html(
        full_html=False,
        include_plotlyjs=include_plotlyjs,
        div_id=div_id,
        default_height=height,
        config={"displaylogo": False, "responsive": True},
    )
    return f'<div class="fig">{html}</div>'


def page(title: str, body: Iterable[str], *, footer: str = "") -> str:
    """A complete HTML document: title, the minimal CSS, the body parts in order and an optional footer."""
    foot = f"<footer>{escape(footer)}</footer>" if footer else ""
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        f"<h1>{escape(title)}</h1>\n" + "\n".join(body) + f"\n{foot}\n</body>\n</html>\n"
    )
