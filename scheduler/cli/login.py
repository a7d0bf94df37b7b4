"""``gsched login``: check a server and a token, then remember them in the user's config file.

Who calls: ``gsched login --server URL [--token-file F] [--ca F]``.  The token comes from
``--token-file`` (the file's path is stored, and read again by each command), else ``--token`` or
``$GSCHED_TOKEN``, else it is asked for (without echo on a terminal, else one line of stdin); then the
token itself is stored.  Nothing is written unless the server answers and accepts the token.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from scheduler.cli import exitcodes, userconfig
from scheduler.protocol.client import Client
from scheduler.protocol.servererror import ServerError


def _ask_token() -> str:
    if sys.stdin.isatty():
        import getpass

        return getpass.getpass("token: ").strip()
    return sys.stdin.readline().strip()


def login(args: argparse.Namespace) -> int:
    server = getattr(args, "server", None)
    if not server:
        print("gsched login: --server URL is required", file=sys.stderr)
        return exitcodes.USAGE
    ca = getattr(args, "ca", None)
    if ca and not Path(ca).is_file():
        print(f"gsched login: --ca {ca}: no such file", file=sys.stderr)
        return exitcodes.USAGE
    token_file = str(Path(args.token_file).expanduser().resolve()) if args.token_file else None
    config = userconfig.UserConfig(server=server, token_file=token_file,
                                   ca=str(Path(ca).resolve()) if ca else None)
    if token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as e:
            print(f"gsched login: --token-file {args.token_file}: {e.strerror}", file=sys.stderr)
            return exitcodes.USAGE
    else:
        token = getattr(args, "token", None) or os.environ.get("GSCHED_TOKEN") or _ask_token()
        config = userconfig.UserConfig(server=config.server, token=token, ca=config.ca)
    if not token:
        print("gsched login: no token given (--token-file F, --token T, $GSCHED_TOKEN or stdin)", file=sys.stderr)
        return exitcodes.USAGE
    try:
        me = Client(server, token, ca).get("/v1/whoami")
    except ServerError as e:
        print(f"gsched login: {e.message}; nothing written", file=sys.stderr)
        return exitcodes.for_error(e)
    path = userconfig.save(config)
    print(f"logged in to {server} as {me['name']}; settings written to {path}")
    return exitcodes.OK
