"""The user's CLI config, ``$XDG_CONFIG_HOME/gsched/config.toml`` (default ``~/.config/gsched/config.toml``).

Written by ``gsched login`` (mode 0600: it may hold a token), read by every verb that talks to a server.
Each of server, token and CA is taken from the first of: the flag (``--server``, ``--token``, ``--ca``),
the environment (``GSCHED_SERVER``, ``GSCHED_TOKEN``, ``GSCHED_CA``), this file, then the built-in
default (``http://127.0.0.1:8470``; the token in ``$GSCHED_HOME/admin.token``).

The file's keys::

    server = "https://gsched.example.org:8470"   # one URL, or several comma-separated (standbys)
    token_file = "/home/alice/.gsched-token"      # where the token is read from, each time ...
    token = "gsu_..."                             # ... or the token itself (login without --token-file)
    ca = "/etc/gsched/ca.pem"                     # verify an HTTPS server against this CA

Only the standard library: the CLI reads this before every request, so it must load fast.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

KEYS = ("server", "token", "token_file", "ca")


class UserConfigError(ValueError):
    """The config file cannot be used as it is; the message names the file and the key."""


class UserConfig:
    """The file's settings (None: not set).  A plain class, not a dataclass: dataclasses would bring
    inspect and ast into every command's start."""

    __slots__ = KEYS

    def __init__(self, server: str | None = None, token: str | None = None, token_file: str | None = None,
                 ca: str | None = None) -> None:
        self.server, self.token, self.token_file, self.ca = server, token, token_file, ca

    def read_token(self) -> str | None:
        """The token itself, or the contents of ``token_file``; None when neither is set."""
        if self.token:
            return self.token.strip()
        if not self.token_file:
            return None
        try:
            return Path(self.token_file).expanduser().read_text().strip()
        except OSError as e:
            raise UserConfigError(f"{config_path()}: token_file {self.token_file}: {e.strerror}") from None


# A line as login writes it: a bare key and a basic string without escapes or control characters.
_PLAIN = re.compile(r'([A-Za-z0-9_-]+) = "([^"\\\x00-\x1f\x7f]*)"')


def plain_strings(text: str) -> dict[str, str] | None:
    """The file's keys when every line is blank, a comment or ``key = "text"`` with no escape in the
    text (what ``save`` writes for ordinary values), each key once: the TOML they are, read without
    tomllib (6 ms of every command's start).  None for anything else: tomllib reads it then."""
    doc: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _PLAIN.fullmatch(line)
        if m is None or m.group(1) in doc:
            return None
        doc[m.group(1)] = m.group(2)
    return doc


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gsched" / "config.toml"


def load() -> UserConfig:
    """The config file's settings; an empty ``UserConfig`` when there is no file."""
    path = config_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return UserConfig()
    except OSError as e:
        raise UserConfigError(f"{path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise UserConfigError(f"{path}: not UTF-8 text") from None
    doc = plain_strings(text)
    if doc is None:
        import tomllib  # a file as a person may write it; what login writes reads without it

        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise UserConfigError(f"{path}: not valid TOML: {e}") from None
    for key, value in doc.items():
        if key not in KEYS:
            raise UserConfigError(f"{path}: unknown key {key!r} (known: {', '.join(KEYS)})")
        if not isinstance(value, str):
            raise UserConfigError(f"{path}: {key} must be a string")
    return UserConfig(**doc)


def save(config: UserConfig) -> Path:
    """Write ``config`` to the config file, created with mode 0600 (its folder 0700); returns the path.

    The file is replaced whole (written beside it, then renamed), so a reader never sees half of it."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    lines = ["# written by `gsched login`; flags and GSCHED_* variables override it\n"]
    for key in KEYS:
        value = getattr(config, key)
        if value:
            lines.append(f"{key} = {json.dumps(value, ensure_ascii=False)}\n")  # a JSON string is a TOML basic string
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.writelines(lines)
    os.chmod(tmp, 0o600)  # O_CREAT's mode does not apply to a file that was already there
    os.replace(tmp, path)
    return path
