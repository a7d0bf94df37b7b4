"""The CLI's parser, walked whole: every option and argument of every verb says what it is for, and
docs/cli.md names every verb and every option (so the docs cannot drift from the parser)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

from scheduler.cli.main import build_parser

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def walk(parser: argparse.ArgumentParser, path: str = "gsched") -> Iterator[tuple[str, argparse.Action]]:
    """(``gsched VERB [ACTION]``, action) for every action of every parser.  argparse has no public
    way to list a parser's actions; ``_actions`` is what its own help formatter reads."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, f"{path} {name}")
        else:
            yield path, action


def test_every_option_and_argument_has_help() -> None:
    missing = [f"{path} {'/'.join(a.option_strings) or a.dest}" for path, a in walk(build_parser())
               if not a.help and a.dest != "help"]
    assert missing == []


def test_every_verb_and_option_is_in_the_docs() -> None:
    text = DOCS.read_text()
    headings = set(re.findall(r"^### `(gsched [^`]+)`", text, re.M))
    verbs = {path for path, _ in walk(build_parser()) if path != "gsched"}
    assert verbs - headings == set(), "verbs without a '### `gsched VERB`' section in docs/cli.md"
    undocumented = []
    for path, a in walk(build_parser()):
        if a.help == argparse.SUPPRESS or a.dest == "help" or path == "gsched":
            continue
        section = text.split(f"### `{path}`", 1)[1].split("\n### ", 1)[0]
        for flag in a.option_strings:
            if flag.startswith("--") and f"`{flag}" not in section:
                undocumented.append(f"{path} {flag}")
    assert undocumented == []
