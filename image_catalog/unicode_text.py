"""Text that UTF-8 cannot hold: JSON's `\\ud800` escapes decode to lone surrogates, which Python
keeps in a str but no file name, database row, environment or command line can take. Both the hub
(spawn options) and the queue service (every JSON body) refuse them once, where they are parsed,
so nothing further in either ever meets one."""

from __future__ import annotations


def surrogate_at(value: object, where: str = "") -> str | None:
    """Where in `value` (JSON data: dicts, lists, text, numbers) a text holds a lone surrogate,
    as a path like `env.KEY` or `command`; None when all of it is valid Unicode. Keys count too."""
    stack = [(where, value)]
    while stack:  # an explicit stack: a body nested deep must not exhaust Python's recursion
        path, item = stack.pop()
        if isinstance(item, str):
            if not _encodes(item):
                return path or "the text"
        elif isinstance(item, dict):
            for key, inner in item.items():
                inner_path = f"{path}.{key}" if path else str(key)
                if isinstance(key, str) and not _encodes(key):
                    return f"a key of {path}" if path else "a key"
                stack.append((inner_path, inner))
        elif isinstance(item, list | tuple):
            stack.extend((f"{path}[{i}]", inner) for i, inner in enumerate(item))
    return None


def surrogate_message(path: str) -> str:
    """The refusal for `surrogate_at`'s answer."""
    return (
        f"{_printable(path)} holds a lone surrogate (such as \\ud800), which is not text: "
        "send valid Unicode."
    )


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _printable(path: str) -> str:
    return path.encode("utf-8", "backslashreplace").decode("utf-8")
