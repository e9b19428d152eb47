"""A TCP proxy in front of a test's redis-server, to hold or cut a call in flight.

:meth:`Proxy.hold` keeps the server's replies from the clients until :meth:`Proxy.release`,
and :meth:`Proxy.wait_request` tells when a request went through meanwhile: the call is
then in flight, applied or about to be by the server, its reply not yet read.
:meth:`Proxy.go_down` cuts every connection and refuses new ones until :meth:`Proxy.come_back`.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from collections.abc import Callable
from types import TracebackType


class Proxy:
    """Forwards 127.0.0.1:``port`` (its own) to 127.0.0.1:``target``, on a thread of its own."""

    def __init__(self, target: int) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._peers: dict[socket.socket, socket.socket] = {}  # each end -> the other
        self._to_clients: set[socket.socket] = set()  # the ends facing the clients
        self._held: dict[socket.socket, bytearray] = {}  # client end -> replies held
        self._holding = False
        self._down = False
        self._closing = False
        self._request = threading.Event()
        self._actions: list[tuple[Callable[[], None], threading.Event]] = []
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._pump, name="test-proxy")
        self._thread.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    # -- what the test does

    def hold(self) -> None:
        """Keep the server's replies from now on, until :meth:`release`."""
        with self._lock:
            self._holding = True
            self._request.clear()

    def wait_request(self, timeout: float = 10.0) -> None:
        """Wait until a client sent a request since :meth:`hold`."""
        assert self._request.wait(timeout), "no request reached the proxy"

    def release(self) -> None:
        """Hand the held replies over and forward replies again."""
        self._on_thread(self._release)

    def go_down(self) -> None:
        """Cut every connection (held replies are lost) and refuse new ones."""
        self._on_thread(self._go_down)

    def come_back(self) -> None:
        with self._lock:
            self._down = False

    def close(self) -> None:
        with self._lock:
            self._closing = True
        self._thread.join(10)
        assert not self._thread.is_alive(), "the proxy did not stop"
        for end in list(self._peers):
            self._drop(end)
        self._selector.close()
        self._listener.close()

    def _on_thread(self, action: Callable[[], None]) -> None:
        """Run ``action`` on the proxy's thread (the one that owns the sockets); wait for it."""
        done = threading.Event()
        with self._lock:
            self._actions.append((action, done))
        assert done.wait(10), "the proxy thread did not answer"

    def __enter__(self) -> Proxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- the thread

    def _pump(self) -> None:
        while True:
            with self._lock:
                if self._closing:
                    return
                actions, self._actions = self._actions, []
            for action, done in actions:
                action()
                done.set()
            for key, _ in self._selector.select(0.02):
                end = key.fileobj
                assert isinstance(end, socket.socket)
                if end is self._listener:
                    self._accept()
                else:
                    self._forward(end)

    def _release(self) -> None:
        with self._lock:
            self._holding = False
            held, self._held = self._held, {}
        for end, data in held.items():
            with contextlib.suppress(OSError):  # that client went away meanwhile
                end.sendall(bytes(data))

    def _go_down(self) -> None:
        with self._lock:
            self._down = True
            self._holding = False
            self._held = {}
        for end in list(self._peers):
            self._drop(end)

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        with self._lock:
            down = self._down
        if down:
            client.close()
            return
        server = socket.create_connection(("127.0.0.1", self.target))
        with self._lock:
            self._peers[client] = server
            self._peers[server] = client
            self._to_clients.add(client)
        for end in (client, server):
            self._selector.register(end, selectors.EVENT_READ)

    def _forward(self, end: socket.socket) -> None:
        try:
            data = end.recv(65536)
        except OSError:
            data = b""
        with self._lock:
            other = self._peers.get(end)
            if other is None:
                return  # dropped meanwhile
            if data and end in self._to_clients and self._holding:
                self._request.set()
            if data and other in self._to_clients and self._holding:
                self._held.setdefault(other, bytearray()).extend(data)
                return
        if not data:
            self._drop(end)
            return
        try:
            other.sendall(data)
        except OSError:
            self._drop(end)

    def _drop(self, end: socket.socket) -> None:
        with self._lock:
            other = self._peers.pop(end, None)
            if other is not None:
                self._peers.pop(other, None)
            self._to_clients.discard(end)
            if other is not None:
                self._to_clients.discard(other)
        for sock in (end, other):
            if sock is None:
                continue
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(sock)
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
