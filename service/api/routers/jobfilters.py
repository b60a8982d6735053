"""The filters of ``GET /jobs`` read from the query (OGC API - Processes 1.0, job-list class):
``datetime`` as a range of the records' ``created`` stamps, ``minDuration`` and
``maxDuration`` as seconds."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timezone

from service.errors import bad_request

# An RFC 3339 date-time (section 5.6) whose day exists in every year: the document's pattern,
# so that whatever a client (or a fuzzer) builds from it is a date the route can read. The
# route takes 29 February of a leap year too (and refuses it in another year with a 400).
_DAY = r"(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1\d|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)|(?:0[13578]|1[02])-31)"
_ANY_DAY = _DAY.replace("2[0-8]", "2[0-9]")
_YEAR = r"(?:000[1-9]|00[1-9]\d|0[1-9]\d\d|[1-9]\d\d\d)"  # 0001-9999, the years Python dates have
_TIME = r"(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,9})?"
_OFFSET = r"(?:[Zz]|[+-](?:[01]\d|2[0-3]):[0-5]\d)"


def _datetime_pattern(day: str) -> str:
    """/req/job-list/datetime-definition: a date-time, or an interval with at least one end
    given (an open end is ".." or empty)."""
    moment = rf"{_YEAR}-{day}[Tt]{_TIME}{_OFFSET}"
    return rf"^(?:{moment}|{moment}/{moment}|(?:\.\.)?/{moment}|{moment}/(?:\.\.)?)$"


DATETIME_PATTERN = _datetime_pattern(_DAY)
_DATETIME = re.compile(_datetime_pattern(_ANY_DAY))

#: Past any number of jobs; SQLite's OFFSET takes a 64-bit integer.
LARGEST_OFFSET = 2**62
_LONGEST_SECONDS = 1e15  # past any job's duration; a bound further out binds as a float all the same


def _stamp(text: str, ceiling: bool) -> str:
    """``text`` (an RFC 3339 date-time) in the records' form (UTC, milliseconds, ``Z``),
    rounded up (``ceiling``) or down to the millisecond; a moment outside years 1-9999 as a
    stamp before or after every record's."""
    fraction = re.search(r"\.(\d+)", text)
    digits = fraction.group(1) if fraction else ""
    whole = re.sub(r"\.\d+", "", text.upper()).replace("Z", "+00:00")
    try:
        moment = datetime.fromisoformat(whole)
    except ValueError as error:
        raise bad_request(f"datetime: {text!r} is not a date-time: {error}") from None
    try:
        moment = moment.astimezone(timezone.utc)
    except OverflowError:
        return "0000" if moment.year == 1 else "9999-99"
    milliseconds = int(digits[:3].ljust(3, "0")) if digits else 0
    if ceiling and digits[3:].strip("0"):
        milliseconds += 1
    stamp = moment.replace(microsecond=0, tzinfo=None).isoformat()
    if milliseconds == 1000:  # rounded up into the next second: compare against that second's stamp
        return stamp + ".999Z~"
    return f"{stamp}.{milliseconds:03d}Z"


def created_range(value: str) -> tuple[str | None, str | None]:
    """The ``created`` stamps (inclusive; None: open) that ``datetime`` selects: an instant is
    the millisecond it names, an interval its ends. 400 if it is neither."""
    if not _DATETIME.match(value):
        raise bad_request(f"datetime: {value[:100]!r} is not an RFC 3339 date-time or an interval "
                          "START/END of them (an open end as .. or empty)")
    if "/" not in value:
        return _stamp(value, ceiling=True), _stamp(value, ceiling=False)
    start, end = value.split("/")
    return (_stamp(start, ceiling=True) if start not in ("", "..") else None,
            _stamp(end, ceiling=False) if end not in ("", "..") else None)


def seconds(name: str, values: list[str], pick: Callable) -> float | None:
    """The bound that ``minDuration`` (``pick=max``) or ``maxDuration`` (``pick=min``) sets:
    integers, repeated or comma-separated, the tightest of them. 400 if one is not an integer."""
    numbers = []
    for value in values:
        for piece in value.split(","):
            try:
                numbers.append(int(piece.strip()))
            except ValueError:
                raise bad_request(f"{name}: {piece[:100]!r} is not an integer (a number of seconds)") from None
    if not numbers:
        return None
    return max(-_LONGEST_SECONDS, min(_LONGEST_SECONDS, float(pick(numbers))))
