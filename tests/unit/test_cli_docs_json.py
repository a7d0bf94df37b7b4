"""docs/cli.md's JSON section names every field the server sends for a job (``service.job_summary``)
and a node (``service.node_rows``), and no other: read from the source (the dict each returns), so the
docs cannot drift from the server as docs/cli.md's verbs cannot drift from the parser."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def returned_keys(function: str) -> set[str]:
    """The string keys of the dict literals ``function`` of scheduler/server/service.py builds."""
    tree = ast.parse((ROOT / "scheduler" / "server" / "service.py").read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function)
    biggest = max((n for n in ast.walk(fn) if isinstance(n, ast.Dict)), key=lambda d: len(d.keys))
    return {k.value for k in biggest.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}


def documented(bullet: str) -> set[str]:
    """The field names (in backquotes, before any parenthesis) of the JSON section's bullet that
    starts with ``bullet``."""
    section = (ROOT / "docs" / "cli.md").read_text().split("## JSON", 1)[1].split("\n## ", 1)[0]
    item = next(b for b in re.split(r"\n\* ", section) if b.startswith(bullet))
    item = re.sub(r"\([^()]*\)", "", item.removeprefix(bullet))  # "(seconds since the epoch)", "(`up`, `down`)"
    return set(re.findall(r"`(\w+)`", item))


def test_the_job_fields_in_the_docs_are_those_the_server_sends() -> None:
    assert documented("a job:") == returned_keys("job_summary")


def test_the_node_fields_in_the_docs_are_those_the_server_sends() -> None:
    assert documented("`nodes`:") == returned_keys("node_rows")
