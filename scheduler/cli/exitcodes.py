"""What ``gsched``'s exit status means (docs/cli.md lists the same), and the status for a failed request.

==  ==========================================================================================
0   success
1   the job failed (``submit --wait`` on a job that ended FAILED, CANCELLED or TIMEOUT), or the
    server answered with an error of its own (5xx), or ``gsched fetch`` saved no checkpoint that
    matches its SHA-256
2   usage or file error: a bad flag, a job.toml or config file that cannot be used, a request the
    server refused as given (400, 409, 413, 422)
3   the server is unreachable: no answer, or an HTTPS certificate that does not verify
4   not found: no such job, node, user or data set (404)
5   not authenticated (401: no token, or an unknown one) or not allowed (403)
==  ==========================================================================================
"""

from __future__ import annotations

from scheduler.protocol.servererror import CERT_ERROR, ServerError

OK = 0
JOB_FAILED = 1
USAGE = 2
UNREACHABLE = 3
NOT_FOUND = 4
DENIED = 5


def for_error(e: ServerError) -> int:
    """The exit status for a request that failed with ``e``."""
    if e.status in (0, CERT_ERROR):
        return UNREACHABLE
    if e.status in (401, 403):
        return DENIED
    if e.status == 404:
        return NOT_FOUND
    if 400 <= e.status < 500:
        return USAGE
    return JOB_FAILED
