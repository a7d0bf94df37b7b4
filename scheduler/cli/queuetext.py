"""``gsched queue``'s view drawn as text, without rich: the screen the rich ``QueueView``
(scheduler/cli/render.py) draws for the same width, from the same cells and layout
(scheduler/cli/queuecells.py), so that one ``gsched queue`` (or ``gsched nodes``) does not pay rich's start-up (``import
rich.console`` alone took 27 ms on the 2-core build machine, more than a bare interpreter's start).
``queue --watch``, ``show`` and ``explain`` keep rich (a live display and nested panels).

What it copies of rich, and how: tables as ``box.SIMPLE_HEAD`` without edges (columns two apart, a
rule under the header), a wrapped column broken between words as rich breaks them (a word longer
than the column is folded), other cells cut with an ellipsis; the width from ``$COLUMNS``, else the
terminal of stdin, stdout or stderr, else 80; colour as SGR codes when stdout is a terminal (or
``FORCE_COLOR`` is set) and ``NO_COLOR`` is not; box and bars in ASCII when stdout cannot encode
UTF-8.  Text is measured in characters: a name in a wide script (CJK) may misalign its row, where
rich would measure cells.
"""

from __future__ import annotations

import os
import re
import sys

from scheduler.cli.queuecells import (
    SEP,
    SIDE_BY_SIDE_NODES,
    WIDE,
    Layout,
    jobs_layout,
    nodes_layout,
    share_cells,
    summary,
)

TYPE_CHECKING = False  # typing: 2 ms of start-up, for annotations only
if TYPE_CHECKING:
    from typing import Any, TextIO

    Spans = list[tuple[str, str]]  # (text, style) pieces of one line

SGR = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "blue": "34", "magenta": "35",
       "cyan": "36"}
GRID_GAP = 4  # between the share and nodes panels side by side (rich's grid padding)
_WORD = re.compile(r"\s*\S+\s*")


class Terminal:
    """How to draw for a stream: ``width`` in columns, ``colour`` on or off, ``ascii_only``."""

    def __init__(self, width: int, colour: bool = False, ascii_only: bool = False) -> None:
        self.width, self.colour, self.ascii_only = width, colour, ascii_only

    @classmethod
    def of(cls, stream: TextIO) -> Terminal:
        """As rich's ``Console()`` would decide for ``stream`` (see the module docstring)."""
        env = os.environ
        width = 0
        try:
            width = int(env.get("COLUMNS", "0"))
        except ValueError:
            pass
        for fd in (0, 1, 2):
            if width > 0:
                break
            try:
                width = os.get_terminal_size(fd).columns
            except (AttributeError, ValueError, OSError):
                pass
        try:
            tty = stream.isatty()
        except (AttributeError, ValueError):
            tty = False
        colour = not env.get("NO_COLOR") and (bool(env.get("FORCE_COLOR"))
                                              or (tty and env.get("TERM", "").lower() not in ("dumb", "unknown")))
        encoding = (getattr(stream, "encoding", None) or "utf-8").lower()
        return cls(width if width > 0 else 80, colour, not encoding.startswith("utf"))

    def paint(self, text: str, style: str) -> str:
        if not (self.colour and style and text):
            return text
        codes = ";".join(SGR[w] for w in style.split() if w in SGR)
        return f"\x1b[{codes}m{text}\x1b[0m" if codes else text


def divide(text: str, width: int) -> list[str]:
    """``text`` broken into lines of at most ``width`` characters between words, a longer word folded
    (rich's ``divide_line`` with ``fold``); trailing spaces of each line removed."""
    lines: list[str] = []
    line = ""
    for m in _WORD.finditer(text):
        word = m.group(0)
        length = len(word.rstrip())
        if width - len(line) >= length:
            line += word
        elif length > width:
            if line:
                lines.append(line)
            chunks = [word[i:i + width] for i in range(0, len(word), width)]
            lines += chunks[:-1]
            line = chunks[-1]
        else:
            if line:
                lines.append(line)
            line = word
    lines.append(line)
    return [x.rstrip() for x in lines]


def _cut(text: str, width: int, ascii_only: bool) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + ("~" if ascii_only else "…")


def _fit(text: str, width: int, justify: str) -> str:
    return text.rjust(width) if justify == "right" else text.ljust(width)


def table(layout: Layout, term: Terminal) -> list[str]:
    """A ``Layout`` as lines: the title, the header, a rule, then each row (its ``wrap`` cell on as many
    lines as it needs, the others cut).  Lines are padded to the table's width (trailing spaces kept:
    a panel beside it lines up)."""
    cols = layout.cols
    widths = [layout.widths[c] for c in cols]
    total = sum(widths) + SEP * (len(cols) - 1)
    gap = " " * SEP
    out = []
    if layout.title:
        out.append(term.paint(layout.title, "bold") + " " * (total - len(layout.title)))
    out.append(gap.join(term.paint(_fit(layout.headers[c], w, layout.justify.get(c, "left")), "bold")
                        for c, w in zip(cols, widths, strict=True)))
    out.append(("-" if term.ascii_only else "─") * total)
    for row, styles in zip(layout.rows, layout.styles, strict=True):
        cells = {c: divide(row[c], w) if c == layout.wrap else [_cut(row[c], w, term.ascii_only)]
                 for c, w in zip(cols, widths, strict=True)}
        for k in range(max(len(lines) for lines in cells.values())):
            parts = []
            for c, w in zip(cols, widths, strict=True):
                text = _fit(cells[c][k] if k < len(cells[c]) else "", w, layout.justify.get(c, "left"))
                if c == "DEVICES" and row.get("_bar") and k == 0:
                    n = len(row["_bar"])
                    text = term.paint(text[:n], row["_bar_style"]) + text[n:]
                else:
                    text = term.paint(text, styles.get(c, ""))
                parts.append(text)
            out.append(gap.join(parts))
    return out


def share_lines(users: list[dict[str, Any]], term: Terminal) -> list[str]:
    """The fair-share panel: per user, shares (and their part), usage, factor with its bar."""
    rows = share_cells(users, term.ascii_only)
    texts = [(u, s, usage, factor + factor_bar) for u, s, usage, factor, factor_bar, _ in rows] or [
        ("(no users)", "", "", "")]
    headers = ("USER", "SHARES", "USAGE", "FACTOR")
    justify = ("left", "right", "right", "left")
    widths = [max(len(r[i]) for r in [headers, *texts]) for i in range(4)]
    total = sum(widths) + SEP * 3
    gap = " " * SEP
    out = [term.paint("fair share", "bold") + " " * (total - len("fair share")),
           gap.join(term.paint(_fit(h, w, j), "bold") for h, w, j in zip(headers, widths, justify, strict=True)),
           ("-" if term.ascii_only else "─") * total]
    for i, r in enumerate(texts):
        cells = [_fit(t, w, j) for t, w, j in zip(r, widths, justify, strict=True)]
        if i < len(rows):  # the factor's bar in its colour
            _, _, _, factor, factor_bar, colour = rows[i]
            cells[3] = factor + term.paint(factor_bar, colour) + cells[3][len(factor) + len(factor_bar):]
        out.append(gap.join(cells))
    return out


def _spans_lines(spans: Spans, term: Terminal) -> list[str]:
    """One line of styled pieces, broken between words to fit the width (as rich wraps a ``Text``)."""
    plain = "".join(t for t, _ in spans)
    styles = [s for t, s in spans for _ in t]
    out = []
    at = 0
    for line in divide(plain, term.width):
        at = plain.index(line, at) if line else at
        pieces, k = [], 0
        while k < len(line):
            j = k
            while j < len(line) and styles[at + j] == styles[at + k]:
                j += 1
            pieces.append(term.paint(line[k:j], styles[at + k]))
            k = j
        out.append("".join(pieces))
        at += len(line)
    return out


def queue_lines(view: dict[str, Any], term: Terminal, note: str = "") -> list[str]:
    """The whole queue: summary line, jobs, fair share and nodes (side by side from ``WIDE`` columns)."""
    width = term.width
    now = view.get("time")
    title, clock, counts = summary(view, narrow=width < WIDE)
    out = _spans_lines([(title, "bold"), (clock, "bold"), ("  ", ""), (counts, ""),
                        *([(f"  {note}", "dim")] if note else [])], term)
    out.append("")
    if view.get("jobs"):
        out += table(jobs_layout(view, width=width, now=now), term)
    else:
        out.append(term.paint("(no jobs)", "dim"))
    out.append("")
    shares = share_lines(view.get("users", []), term)
    side_by_side = width >= WIDE
    nodes = table(nodes_layout(view.get("nodes", []), now, term.ascii_only,
                               width=width - SIDE_BY_SIDE_NODES if side_by_side else width), term)
    if side_by_side:
        left = len(_plain(shares[0]))
        for k in range(max(len(shares), len(nodes))):
            a = shares[k] if k < len(shares) else " " * left
            out.append(a + " " * GRID_GAP + (nodes[k] if k < len(nodes) else ""))
    else:
        out += [*shares, "", *nodes]
    return [line.rstrip() for line in out]


_SGR_CODE = re.compile(r"\x1b\[[0-9;]*m")


def _plain(text: str) -> str:
    return _SGR_CODE.sub("", text)


def print_queue(view: dict[str, Any], note: str = "", stream: TextIO | None = None) -> None:
    """Write the queue view to ``stream`` (stdout), drawn for it (``Terminal.of``)."""
    stream = stream or sys.stdout
    term = Terminal.of(stream)
    stream.write("\n".join(queue_lines(view, term, note)) + "\n")


def print_nodes(nodes: list[dict[str, Any]], now: float, stream: TextIO | None = None) -> None:
    """Write ``gsched nodes``' table to ``stream`` (stdout), drawn for it (``Terminal.of``)."""
    stream = stream or sys.stdout
    term = Terminal.of(stream)
    lines = table(nodes_layout(nodes, now, term.ascii_only, width=term.width), term)
    stream.write("\n".join(line.rstrip() for line in lines) + "\n")
