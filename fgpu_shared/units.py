"""Memory sizes as people write them ("512M", "2G", "1.5GiB") and as Docker counts them (bytes),
and amounts of CPU cores or fGPU units as people type them.

Docker's suffixes are binary whatever their spelling, so "1G", "1GB" and "1GiB" are all 2**30 bytes;
following Docker here means a limit typed on the form is the limit the cgroup shows.
"""

from __future__ import annotations

import math
import re
from decimal import ROUND_HALF_UP, Decimal

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def parse_size(value: int | float | str) -> int:
    """Return a size in bytes; raise ValueError with a readable message when it is not one."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise ValueError(f"{value!r} is not a whole number of bytes")
        return int(value)
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a size")
    match = _SIZE_RE.match(value)
    if not match:
        raise ValueError(f"{value!r} is not a size; write it like 512M, 2G or 1.5GiB")
    number, prefix, _ = match.groups()
    size = float(number) * 1024 ** _POWERS[prefix.lower()]
    if not math.isfinite(size):
        raise ValueError(f"{value[:20]!r}... is too large to be a size")
    return int(size)


def parse_positive_size(value: int | float | str) -> int:
    """Return a size in bytes that is more than zero: a memory limit, a GPU's memory."""
    size = parse_size(value)
    if size <= 0:
        raise ValueError(f"must be greater than zero, not {value!r}")
    return size


def parse_amount(value: object, zero_ok: bool = False) -> float:
    """Return a finite amount (CPU cores, fGPU units) above zero, or zero too if `zero_ok`;
    raise ValueError with a readable message ("must be a number, not 'x'") when it is not one."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"must be a number, not {value!r}")
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise ValueError(f"must be a number, not {str(value)[:20]!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"must be a finite number, not {value!r}")
    if number < 0 or (number == 0 and not zero_ok):
        raise ValueError(f"must be greater than zero, not {value!r}")
    return number


def format_size(nbytes: int) -> str:
    """A size as people read it: binary IEC units with a space, two decimals at most, halves up:
    532 → '532 B', 1610612736 → '1.5 GiB', 1207959552 → '1.13 GiB'.

    The one way sizes are shown, on every page: queue_service/static/fgpu.js's `size` gives the
    same text for the same bytes (tests/test_page_details.py holds the two side by side), and a
    form reads it back (parse_size takes '1.5 GiB'). Halves round up, as JavaScript's toFixed
    does, so the two agree on 1.125 GiB too. The API's sizes stay numbers of bytes.
    """
    for suffix, power in (("TiB", 4), ("GiB", 3), ("MiB", 2), ("KiB", 1)):
        scaled = nbytes / 1024**power
        if scaled >= 1:
            # A float divided by a power of two is exact, so Decimal sees the true value.
            text = str(Decimal(scaled).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))
            return f"{text.rstrip('0').rstrip('.')} {suffix}"
    return f"{nbytes} B"


def simulated_gpu_name(memory_bytes: int) -> str:
    """The name of a simulated GPU of that size. One function for the inventory (pages, API) and
    the spawner (the session's `nvidia-smi` stand-in), so that both show the same GPU."""
    return f"Simulated GPU ({format_size(memory_bytes)})"


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION_RE = re.compile(r"(?:(\d+(?:\.\d+)?)\s*([smhd]))\s*", re.IGNORECASE)
_NOT_A_DURATION = "is not a duration (seconds, or e.g. 90m, 8h, 1d, 1h30m)"


def format_duration(seconds: float) -> str:
    """3600 → "1 h", 5400 → "1 h 30 min", 45 → "45 s": every duration the pages and messages
    show (the pages' `spoken` gives the same text)."""
    seconds = round(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    parts = [f"{h} h" if h else "", f"{m} min" if m else "", f"{s} s" if s else ""]
    return " ".join(p for p in parts if p) or "0 s"


def parse_duration(value) -> float | None:
    """Seconds from a number (seconds) or a string ("3600", "90m", "8h", "1d", "1h30m"); None for
    0 (no limit). A ValueError for anything else (negative, not finite, unknown unit)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        seconds = _duration_text(value.strip())
    else:
        raise ValueError(f"{value!r} {_NOT_A_DURATION}")
    if not 0 <= seconds < float("inf"):
        raise ValueError(f"{value!r} is not a duration (zero or more seconds)")
    return seconds or None


def _duration_text(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        parts = _DURATION_RE.findall(text)
        if not parts or _DURATION_RE.sub("", text):
            raise ValueError(f"{text!r} {_NOT_A_DURATION}") from None
        return sum(float(n) * _DURATION_UNITS[unit.lower()] for n, unit in parts)
