"""Durations: one grammar for job.toml, the CLI and the config.

Accepted, as text:

* units, each at most once and largest first: ``90s``, ``30m``, ``2h``, ``1d``, ``2h30m``, ``1d12h``;
* Slurm's clock forms: ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``;
* a bare number of seconds, ``"90"``.

After the leading field, minutes and seconds are below 60, and hours below 24 after a day
(``"99:99"`` is refused rather than read as 6,039 s).  A bare integer (not text) is seconds.
Slurm reads a bare number as minutes; gsched's job.toml has always read it as seconds, and keeps that.
"""

from __future__ import annotations

import re

_UNITS = re.compile(r"(?:(\d{1,6})d)?(?:(\d{1,7})h)?(?:(\d{1,9})m)?(?:(\d{1,10})s)?")
_CLOCK = re.compile(r"(?:(\d{1,6})-)?(\d{1,7})(?::(\d{1,2}))?(?::(\d{1,2}))?")
HINT = "use '90s', '30m', '2h30m', '1d', 'MM:SS', 'HH:MM:SS', 'D-HH:MM:SS' or a number of seconds"


def parse_duration(value: int | str) -> int:
    """Seconds in ``value``; raises ``ValueError`` with the accepted forms."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"must be a duration ({HINT})")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must not be negative")
        return value
    text = re.sub(r"\s+", "", value).lower()
    if not text:
        raise ValueError(f"is empty ({HINT})")
    if text.isdigit() and len(text) <= 10:
        return int(text)
    m = _UNITS.fullmatch(text)
    if m and any(m.groups()):
        d, h, mi, s = (int(g or 0) for g in m.groups())
        return ((d * 24 + h) * 60 + mi) * 60 + s
    m = _CLOCK.fullmatch(text)
    if m and (m.group(1) is not None or m.group(3) is not None):
        days, first, second, third = m.groups()
        if days is not None:  # D-HH[:MM[:SS]]
            parts = [int(first), int(second or 0), int(third or 0)]
            if parts[0] >= 24 or parts[1] >= 60 or parts[2] >= 60:
                raise ValueError(f"{value!r}: hours must be below 24, minutes and seconds below 60")
            return int(days) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]
        if third is None:  # MM:SS
            if int(second) >= 60:
                raise ValueError(f"{value!r}: seconds must be below 60")
            return int(first) * 60 + int(second)
        if int(second) >= 60 or int(third) >= 60:  # HH:MM:SS
            raise ValueError(f"{value!r}: minutes and seconds must be below 60")
        return int(first) * 3600 + int(second) * 60 + int(third)
    raise ValueError(f"{value!r} is not a duration ({HINT})")
