"""Each SSH connection's received bytes are acknowledged at once (Linux's TCP_QUICKACK), which
takes about 80 ms off every login of OpenSSH's client without a terminal (`ssh hub cmd`, `sftp`,
`scp`, VS Code's Remote-SSH).

Why: such a client keeps Nagle's algorithm on, and twice during the handshake it sends two small
packets in a row (its KEXINIT then its key exchange; its NEWKEYS then its service request). The
second waits until the first is acknowledged, while the kernel here delays that acknowledgement
(up to 40 ms) for an answer to carry it, which the service cannot send before the second packet
comes: 40 ms lost each time. Measured on loopback: 70-117 ms from connect to exit of `ssh true`
against a bare asyncssh server, 24-51 ms with this.

The flag is not kept by the kernel (it goes back to delaying as it sees fit), so it is set again
after each read: one system call per read, next to the read's own.
"""

from __future__ import annotations

import contextlib
import socket

QUICKACK = getattr(socket, "TCP_QUICKACK", None)


def acknowledge_at_once(conn) -> None:
    """Make `conn` (an asyncssh connection, just made) acknowledge what it reads at once; nothing
    where the system has no such option, or the transport no socket."""
    sock = conn.get_extra_info("socket")
    if QUICKACK is None or sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    received = conn.data_received

    def data_received(data: bytes, datatype=None) -> None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, QUICKACK, 1)
        received(data, datatype)

    # asyncio's transport looks the protocol's method up at each read.
    conn.data_received = data_received
