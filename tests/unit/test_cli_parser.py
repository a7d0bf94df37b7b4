"""The CLI's parser, walked whole: every option and argument of every verb says what it is for, and
docs/cli.md names every verb and every option (so the docs cannot drift from the parser).  A command
builds only its verb's arguments (``build_parser(verb_of(argv))``): it must parse as the whole does."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.cli.main import VERBS, build_parser, verb_of

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


@pytest.mark.parametrize("argv", [
    ["queue"], ["queue", "-o", "json", "--user", "bob"], ["--server", "http://a:1,http://b:2", "queue", "--mine"],
    ["--server=http://a:1", "--token", "gsu_x", "submit", "job.toml", "--array", "0-3%2", "--wait"],
    ["submit", "job.toml", "--server", "http://a:1"], ["cancel", "3", "4"], ["user", "add", "carol", "--admin"],
    ["--ca", "ca.pem", "data", "place", "tiny", "--replicas", "3"], ["node", "drain", "n1", "--reason", "disk"],
    ["show", "7", "--json"], ["hold", "1", "2"], ["completion", "zsh"], ["history", "--since", "2h"],
])
def test_a_command_parses_as_the_whole_parser_would(argv: list[str]) -> None:
    assert verb_of(argv) == next(w for w in argv if w in VERBS)
    assert build_parser(verb_of(argv)).parse_args(argv) == build_parser().parse_args(argv)


@pytest.mark.parametrize("argv", [[], ["--help"], ["-h", "queue"], ["--version"], ["quue"], ["--install-completion"],
                                  ["--install-completion", "print"]])
def test_help_a_bad_verb_or_no_verb_builds_the_whole_parser(argv: list[str]) -> None:
    assert verb_of(argv) is None


@pytest.mark.parametrize("argv", [["queue", "--bogus"], ["--token", "x", "--bogus", "queue"], ["submit"],
                                  ["queue", "-o", "yaml"], ["queue", "--help"]])
def test_a_one_verb_parser_says_what_the_whole_one_says(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    said = []
    for parser in (build_parser(verb_of(argv)), build_parser()):
        with pytest.raises(SystemExit) as e:
            parser.parse_args(argv)
        out = capsys.readouterr()
        said.append((e.value.code, out.out, out.err))
    assert said[0] == said[1]
