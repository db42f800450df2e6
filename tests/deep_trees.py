"""Deep trees for tests: made on disk as a session can, and removed without recursion."""

from __future__ import annotations

import os

from queue_service.store.tree_walk import remove_tree


def deep_tree(top: str, depth: int = 2000) -> None:
    """`depth` nested directories `a`, each with a 10-byte file and a link out: made by
    descriptor, since the path is longer than the kernel takes in one piece."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        with open(os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "wb") as file:
            file.write(b"0123456789")
        os.symlink("/etc", "out", dir_fd=fd)
        os.mkdir("a", dir_fd=fd)
        inner = os.open("a", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)


def empty_out(path) -> None:
    """Remove all in `path` without recursion: pytest's own clean-up of old temporary
    directories uses `shutil.rmtree`, which a deep tree left there would break for every run."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in os.listdir(fd):
            remove_tree(fd, name)
    finally:
        os.close(fd)
