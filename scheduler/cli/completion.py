"""Shell completion for ``gsched`` in bash, zsh and fish, by argcomplete.

Who calls: ``gsched completion bash|zsh|fish`` prints the script that registers it (``eval`` it, or put
it where the shell loads completions: docs/cli.md), and ``gsched --install-completion [install|print]``
installs (or prints) the bash one.  The script runs ``gsched`` itself to complete: ``main`` calls
``complete(parser)`` when the shell asks (``_ARGCOMPLETE`` is set), before anything else, so every verb,
action and option completes from the parser as it is, and the values marked with ``ServerNames``
(job ids, data set and node names) from the server, with a short timeout (nothing when it does not
answer).  argcomplete is imported only then, so a normal command pays nothing for it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

TYPE_CHECKING = False  # typing: 2 ms of every command's start, and only the annotations use it
if TYPE_CHECKING:
    from typing import Any

SHELLS = ("bash", "zsh", "fish")


class ServerNames:
    """An argcomplete completer: the job ids (``jobs``), data set names (``datasets``) or node names
    (``nodes``) the server lists, that start with what was typed."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __call__(self, prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
        from scheduler.cli.connect import client

        try:
            c = client(parsed_args)
            c.timeout_s = 2.0
            if self.kind == "jobs":
                names = [str(j["id"]) for j in c.every_page("/v1/jobs")["jobs"]]
            elif self.kind == "datasets":
                names = [d["name"] for d in c.get("/v1/datasets")]
            else:
                names = [n["name"] for n in c.get("/v1/nodes")]
        except Exception:  # completion must never print a traceback into the user's prompt
            return []
        return [n for n in names if n.startswith(prefix)]


def mark(action: argparse.Action, kind: str) -> argparse.Action:
    """Complete ``action``'s values with ``ServerNames(kind)``; returns the action."""
    action.completer = ServerNames(kind)  # type: ignore[attr-defined]
    return action


def complete(parser: argparse.ArgumentParser) -> None:
    """Answer the shell's completion request and exit (argcomplete's protocol); returns at once when
    the shell did not ask."""
    if "_ARGCOMPLETE" not in os.environ:
        return
    import argcomplete

    argcomplete.autocomplete(parser)


def script(shell: str) -> str:
    """The script that registers ``gsched``'s completion in ``shell``."""
    import argcomplete

    return str(argcomplete.shellcode(["gsched"], shell=shell))


def install_completion(parser: argparse.ArgumentParser, mode: str) -> int:
    """``print``: write the bash script to stdout; ``install``: into the user's bash-completion folder."""
    text = script("bash")
    if mode == "print":
        sys.stdout.write(text)
        return 0
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    path = base / "bash-completion" / "completions" / "gsched"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"bash completion written to {path}; it loads in new shells (bash-completion 2.x), "
          f"or now with: source {path}")
    return 0
