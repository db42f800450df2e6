"""An SSH connection's socket acknowledges what it reads at once (queue_service/ssh/quick_acks.py):
after each read the socket is back in Linux's quick-ACK mode, whatever the kernel made of it, and
the bytes go on to asyncssh unchanged. On a real loopback TCP connection; the connection object
around it stands in for asyncssh's, of which only the socket and `data_received` are used. What
it saves (about 80 ms a login): benchmarks/ssh_sftp.py."""

from __future__ import annotations

import socket

from queue_service.ssh.quick_acks import acknowledge_at_once


class Connection:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.read = []

    def get_extra_info(self, name: str, default=None):
        return self.sock if name == "socket" else default

    def data_received(self, data: bytes, datatype=None) -> None:
        self.read.append((data, datatype))


def quickack(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK)


def test_each_read_puts_the_socket_back_in_quick_ack_mode():
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    with listener, client, server:
        conn = Connection(server)
        acknowledge_at_once(conn)
        for _ in range(3):
            server.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 0)  # the kernel's delaying
            assert quickack(server) == 0
            client.sendall(b"packet")
            conn.data_received(server.recv(64))
            assert quickack(server) == 1
        assert conn.read == [(b"packet", None)] * 3
