"""One upload chunk on its way to disk, written as its bytes come in (never kept whole in memory),
and what is left when it does not arrive whole.

A chunk goes to one of two places (`FolderFiles.open_chunk` opens it, link-free):
- **in place**, at the end of the file it continues (`?offset=N` of a sequential upload): a chunk
  that fails is cut off again (the file is back to `N` bytes);
- **into a part file**, a hidden sibling `.fgpu-upload-<id>` of the file being uploaded: the
  first chunk of a sequential upload (so that a file it replaces stays whole until the chunk is
  in), and every chunk of a parallel upload (`?size=`, uploads.py), each at its own offset.
  The part file becomes the file (`rename`, atomic) only when every byte is in: a file is never
  seen half-made under its own name.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets

from queue_service.core.errors import Refusal

#: Part files' names: hidden, and never a name a user picks by chance.
PART_PREFIX = ".fgpu-upload-"


def part_name() -> str:
    return PART_PREFIX + secrets.token_hex(8)


def is_part_name(name: str) -> bool:
    return name.startswith(PART_PREFIX) and len(name) == len(PART_PREFIX) + 16


class ChunkWrite:
    """Where one chunk's bytes go: `write` them as they come, then `finish` or `abandon`."""

    def __init__(self, fd: int, parent: int, start: int, name: str, part: str | None, new: bool):
        self.fd, self.parent = fd, parent
        self.start = self.position = start
        #: The file's name in its directory, and the part file written instead (None: in place).
        self.name, self.part = name, part
        #: Whether the part file was made for this chunk (a sequential upload's first chunk):
        #: removed again if the chunk fails, renamed to `name` when it is in.
        self.new = new

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                written = os.pwrite(self.fd, view, self.position)
            except OSError as e:  # the kernel's project quota, or the disk, is full
                if e.errno not in (errno.EDQUOT, errno.ENOSPC):
                    raise
                raise Refusal(
                    f"No room left for the upload: {os.strerror(e.errno)}.", "full"
                ) from None
            self.position += written
            view = view[written:]

    @property
    def written(self) -> int:
        return self.position - self.start

    def finish(self, rename: bool) -> None:
        """The chunk is in: `rename` makes the part file the file (the upload is complete)."""
        try:
            if rename:
                self.make_whole()
        finally:
            self.close()

    def make_whole(self) -> None:
        try:
            os.rename(self.part, self.name, src_dir_fd=self.parent, dst_dir_fd=self.parent)
        except OSError as e:  # a session made a directory of that name meanwhile
            if e.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise Refusal(
                    f"{self.name!r} is a directory now; upload again.", "conflict"
                ) from None
            raise

    def abandon(self) -> None:
        """The chunk did not come whole (refused, cut short): leave what was there before it.
        A parallel upload's part file keeps the bytes, to be written over when the chunk comes
        again: its record (uploads.py) counts only chunks that came whole."""
        try:
            if self.part is None:
                os.ftruncate(self.fd, self.start)
            elif self.new:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.part, dir_fd=self.parent)
        finally:
            self.close()

    def close(self) -> None:
        for fd in (self.fd, self.parent):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fd = self.parent = -1
