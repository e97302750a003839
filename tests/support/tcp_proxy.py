"""A TCP proxy on a loopback port in front of a server, for tests that need an outage at an exact
moment: `cut_after(marker)` lets the first request that carries `marker` through, waits for the
server's answer (so the request surely ran), and then, instead of passing the answer on, closes
every connection and stops listening, as a server that dies between running a command and
answering it would; `resume()` listens again on the same port. With `only_that_connection`, it
closes that request's connection alone and keeps listening, as a server that drops one client
(CLIENT KILL, a restart quicker than the client's next connect) would. `cut_before(marker)`
cuts the same way without passing the marked request on: a server that went away just before
it arrived.
"""

import select
import socket
import threading

# A connection's pumps wake this often to see whether the proxy is shutting down.
POLL_SECONDS = 0.05
# How long the proxy waits for the server's answer to the marked request (a hang guard).
ANSWER_HANG = 60.0


class TcpProxy:
    def __init__(self, target_port, host="127.0.0.1"):
        self.host = host
        self.target_port = target_port
        self._lock = threading.Lock()
        self._connections = []  # (client socket, server socket)
        self._marker = None
        self._cut_one = False
        self._run_marked = True  # whether the marked request reaches the server
        self._stopped = False
        self.cut = threading.Event()  # set once the marked request ran and was cut off
        self._listener = self._listen(0)
        self.port = self._listener.getsockname()[1]
        self._start_accepting()

    def url(self, db=0):
        return "redis://%s:%d/%d" % (self.host, self.port, db)

    def cut_after(self, marker, only_that_connection=False):
        """Arms the cut: the first request whose bytes contain `marker` (bytes)."""
        with self._lock:
            self._marker = marker
            self._cut_one = only_that_connection
            self._run_marked = True

    def cut_before(self, marker):
        """Arms a cut of everything at the first request that contains `marker`, which the
        server never sees."""
        with self._lock:
            self._marker = marker
            self._cut_one = False
            self._run_marked = False

    def cut_now(self):
        """Closes every connection and stops listening at once, as a server that dies."""
        with self._lock:
            self._drop_all()
        self.cut.set()

    def resume(self):
        """Listens again, on the same port, after a cut."""
        with self._lock:
            self._listener = self._listen(self.port)
        self._start_accepting()

    def close(self):
        with self._lock:
            self._stopped = True
            self._drop_all()

    # -- inside --------------------------------------------------------------------------------
    def _listen(self, port):
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, port))
        listener.listen(64)
        return listener

    def _start_accepting(self):
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def _accept(self, listener):
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by a cut or by close()
            try:
                server = socket.create_connection((self.host, self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._stopped or listener is not self._listener:
                    client.close()
                    server.close()
                    return
                self._connections.append((client, server))
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _drop_all(self):
        """With the lock held: closes the listener and every connection."""
        try:
            # Before close: a thread blocked in accept() would keep a closed socket listening.
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        for client, server in self._connections:
            for s in (client, server):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
        self._connections = []

    def _pump(self, client, server):
        """Carries bytes both ways until either side closes; cuts at the marked request."""
        seen = b""  # the client's bytes so far, to find a marker split across reads
        while True:
            try:
                ready, _, _ = select.select([client, server], [], [], POLL_SECONDS)
            except (OSError, ValueError):
                return  # closed by a cut
            for source in ready:
                try:
                    data = source.recv(65536)
                except OSError:
                    return
                if not data:
                    self._close_pair(client, server)
                    return
                destination = server if source is client else client
                if source is client:
                    seen = (seen + data)[-65536:]
                    with self._lock:
                        marked = self._marker is not None and self._marker in seen
                        if marked:
                            self._marker = None
                    if marked:
                        self._cut(client, server, data)
                        return
                try:
                    destination.sendall(data)
                except OSError:
                    self._close_pair(client, server)
                    return

    def _cut(self, client, server, request):
        """Passes the rest of the request on, waits for the first byte of the answer (the
        request ran), and then drops everything without passing the answer on. (With
        cut_before, drops everything at once.)"""
        answered = not self._run_marked
        if not answered:
            server.sendall(request)
        while not answered:
            ready, _, _ = select.select([client, server], [], [], ANSWER_HANG)
            if not ready:
                break  # the hang guard: cut anyway
            for source in ready:
                data = source.recv(65536)
                if source is server or not data:
                    answered = True  # the answer (the request ran), or the client gave up
                else:
                    server.sendall(data)
        self.cut.set()  # before the client can see the cut and go on
        if self._cut_one:
            self._close_pair(client, server)
        else:
            with self._lock:
                self._drop_all()

    def _close_pair(self, client, server):
        with self._lock:
            if (client, server) in self._connections:
                self._connections.remove((client, server))
        for s in (client, server):
            try:
                s.close()
            except OSError:
                pass
