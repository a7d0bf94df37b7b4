"""Reading a job.toml on the client: parse it, and check that it can travel as JSON.

TOML has values JSON lacks (dates and times, ``nan`` and ``inf``) and Python's parser takes integers
of thousands of digits and tables of any depth; each would end ``gsched submit`` in a traceback before the
request was sent.  ``read_job_file`` names the file and the key instead.  Whether the keys and values
make a valid job is the server's to say (scheduler/core/jobspec.py); this module imports nothing heavy, so
``submit`` stays quick to start.
"""

from __future__ import annotations

import datetime
import math
import tomllib
from typing import Any

# A job.toml is three levels deep.  Deeper documents still go to the server, which names the unknown
# key; past this, encoding the request as JSON would overflow the interpreter's recursion limit.
MAX_DEPTH = 500


class JobFileError(ValueError):
    pass


def read_job_file(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        raise JobFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise JobFileError(f"{path}: is a directory, not a job file") from None
    except PermissionError:
        raise JobFileError(f"{path}: permission denied") from None
    except tomllib.TOMLDecodeError as e:
        raise JobFileError(f"{path}: not valid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise JobFileError(f"{path}: not UTF-8 text: {e}") from None
    except RecursionError:
        raise JobFileError(f"{path}: not valid TOML: arrays or tables nested too deeply") from None
    except ValueError:  # an integer longer than Python converts (sys.get_int_max_str_digits(), 4,300)
        raise JobFileError(f"{path}: not valid TOML: a number is too long (an integer of thousands of digits)") from None
    problem = json_problem(doc)
    if problem:
        raise JobFileError(f"{path}: {problem}")
    return doc


def json_problem(doc: Any) -> str | None:
    """The first key whose value JSON cannot carry, as ``"key.path: why"``; None when all can.

    Walked with a stack, not recursion, so a deep document is refused rather than overflowing."""
    stack: list[tuple[str, Any, int]] = [("", doc, 0)]
    while stack:
        where, value, depth = stack.pop()
        name = where or "job"
        if depth > MAX_DEPTH:
            return f"{name[:80]}...: tables or arrays nested more than {MAX_DEPTH} deep"
        if isinstance(value, dict):
            stack.extend((f"{where}.{k}" if where else str(k), v, depth + 1) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", v, depth + 1) for i, v in reversed(list(enumerate(value))))
        elif isinstance(value, datetime.date | datetime.time):  # datetime is a date
            return f"{name}: a TOML date or time ({value.isoformat()}) is not a value of any job key; quote it or use a number"
        elif isinstance(value, float) and not math.isfinite(value):
            return f"{name}: {value} is not a number a job key takes"
    return None
