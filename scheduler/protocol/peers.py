"""A peer's address, and the one place URLs to agents' data servers are built.

An agent reports its data server's address in each heartbeat and the server hands it on unchanged
(to other agents: staging sources, mirror peers, copies; to the CLI: scans, links, uploads, fetches;
to its own nudges):

* ``host:port``: the data server speaks plain HTTP (no ``gsched agent --tls-cert``);
* ``https://host:port``: it serves HTTPS only, with a certificate the cluster's CA signed.

Whoever connects to a peer calls ``peer_url`` with ``peer_context(ca)``: an HTTPS peer is verified
against ``ca`` (the cluster's CA, the file the caller was given with ``--ca`` / ``GSCHED_CA``), else
against the system's CAs, which a private CA is not among.  ``untrusted(e)`` tells a failed request
whose peer certificate did not verify, and ``PEER_CA_HINT`` says what to do about it.
"""

from __future__ import annotations

import ssl

HTTPS = "https://"
PEER_CA_HINT = ("the peer's TLS certificate is not trusted: give this process the cluster's CA "
                "(--ca FILE or GSCHED_CA), the CA that signed the agents' certificates")


def advertised(host: str, port: int, tls: bool) -> str:
    """The address an agent reports for its data server on ``host:port``."""
    return f"{HTTPS if tls else ''}{host}:{port}"


def is_tls(address: str) -> bool:
    return address.startswith(HTTPS)


def peer_url(address: str, resource: str) -> str:
    """The URL of ``resource`` (a path without its leading slash) on the data server at ``address``."""
    return f"{address}/{resource}" if is_tls(address) else f"http://{address}/{resource}"


def peer_host(address: str) -> str:
    """The host part of ``address`` (no scheme, no port): where the node's ranks are reached too."""
    return address.removeprefix(HTTPS).rsplit(":", 1)[0]


def peer_context(ca: str | None) -> ssl.SSLContext:
    """The TLS context for HTTPS peers: verified against ``ca``, else the system's CAs."""
    return ssl.create_default_context(cafile=ca) if ca else ssl.create_default_context()


def untrusted(e: BaseException) -> bool:
    """Whether the request that raised ``e`` failed because the peer's certificate did not verify
    (urllib's ``URLError`` carries the cause in ``reason``)."""
    return isinstance(e, ssl.SSLCertVerificationError) or isinstance(getattr(e, "reason", None),
                                                                      ssl.SSLCertVerificationError)


def why(e: BaseException) -> str:
    """What to say about a request to a peer that got no answer: ``PEER_CA_HINT`` for a certificate
    that did not verify, else the error."""
    return f"{PEER_CA_HINT} ({getattr(e, 'reason', e)})" if untrusted(e) else str(e)
