"""Reading the end of a running job's log within a byte budget.

The engine's log API reads forward from the `tail`-th line from the end, so one request for
thousands of long lines would read them all (a log line may be 16 KiB: 10,000 lines are 160 MB).
Instead the end is read in growing windows (a few lines, then four times as many, ...), each read
as a stream and dropped the moment it passes the budget: a request reads a few times the budget
at most, and the answer is the largest window that fits, marked when lines were left out.

Blocking calls (docker-py): the callers run them in a thread.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable

#: Bytes of log one request answers with, and so reads at most a small multiple of.
READ_MAX = 4 * 1024 * 1024
#: The first window's lines, and how much each next window grows.
FIRST_WINDOW = 200
GROWTH = 4


def cut_note(lines: int, limit: int = READ_MAX) -> str:
    """The line an answer starts with when it holds fewer lines than asked for."""
    return (
        f"[fgpu: only the last {lines} lines fit in the {limit // (1024 * 1024)} MiB an answer "
        "holds; the whole log is in ~/jobs once the job ends]\n"
    )


def read_within(chunks: Iterable[bytes], limit: int) -> bytes | None:
    """All of `chunks` if they come to at most `limit` bytes, else None (read no further)."""
    parts, size = [], 0
    try:
        for chunk in chunks:
            size += len(chunk)
            if size > limit:
                return None
            parts.append(chunk)
    finally:
        with contextlib.suppress(Exception):
            chunks.close()  # a stream left early closes its connection now
    return b"".join(parts)


def bounded_tail(read: Callable[[int], Iterable[bytes]], lines: int, limit: int = READ_MAX) -> str:
    """The log's last `lines` lines, or the most of its last lines that fit in `limit` bytes
    (then after a note saying so). `read(n)` streams the log's last n lines."""
    window, kept = min(lines, FIRST_WINDOW), None
    while True:
        raw = read_within(read(window), limit)
        if raw is None:
            break
        kept = (window, raw)
        if window >= lines or raw.count(b"\n") < window:
            return raw.decode(errors="replace")  # all asked for, or the whole log
        window = min(lines, window * GROWTH)
    if kept is None:  # even the first window is too long: its last whole lines within the limit
        raw = read_within(read(1), limit) or b""
        return cut_note(1, limit) + raw[-limit:].decode(errors="replace")
    shown, raw = kept
    return cut_note(shown, limit) + raw.decode(errors="replace")
