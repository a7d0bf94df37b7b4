"""The client every verb uses: the server, token and CA from the flags, else ``GSCHED_*``, else the
config file that ``gsched login`` writes (scheduler/cli/userconfig.py), else the built-in defaults."""

from __future__ import annotations

import argparse
import os

from scheduler.cli import userconfig
from scheduler.protocol.client import Client


def client(args: argparse.Namespace) -> Client:
    """A client for the verb's ``args`` (``--server``, ``--token``, ``--ca`` where it has them)."""
    config = userconfig.load()
    server = getattr(args, "server", None) or os.environ.get("GSCHED_SERVER") or config.server
    token = getattr(args, "token", None) or os.environ.get("GSCHED_TOKEN") or config.read_token()
    ca = getattr(args, "ca", None) or os.environ.get("GSCHED_CA") or config.ca
    return Client(server, token, ca)
