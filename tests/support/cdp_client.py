"""A minimal Chrome DevTools Protocol client over a WebSocket, in the Python standard library
only, so the dashboard test can drive Debian's headless Chromium without extra packages: open a
tab, evaluate JavaScript in it, take a screenshot. Only what those need of RFC 6455: a client
handshake, masked text frames out, unfragmented or fragmented text frames in, ping/close."""

import base64
import json
import os
import socket
import struct
import time
import urllib.parse


class CdpError(Exception):
    pass


class CdpConnection:
    def __init__(self, ws_url, timeout=30):
        url = urllib.parse.urlparse(ws_url)
        self.timeout = timeout  # the longest any one call may take, events included
        self.deadline = None
        self.sock = socket.create_connection((url.hostname, url.port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        request = ("GET %s HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\n"
                   "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
                   "Sec-WebSocket-Version: 13\r\n\r\n" % (url.path, url.hostname, url.port, key))
        self.sock.sendall(request.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise CdpError("connection closed during the WebSocket handshake")
            head += chunk
        status_line = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status_line:
            raise CdpError("WebSocket handshake refused: %r" % status_line)
        self.buffer = head.split(b"\r\n\r\n", 1)[1]
        self.next_id = 0

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def _read(self, n):
        while len(self.buffer) < n:
            if self.deadline is not None:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    raise CdpError("no answer within %ss (hang guard)" % self.timeout)
                self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise CdpError("connection closed")
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def _send_frame(self, opcode, payload):
        header = bytes([0x80 | opcode])
        n = len(payload)
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 65536:
            header += bytes([0x80 | 126]) + struct.pack("!H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack("!Q", n)
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def _receive_message(self):
        parts = []
        while True:
            first, second = self._read(2)
            opcode, n = first & 0x0F, second & 0x7F
            if n == 126:
                n = struct.unpack("!H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._read(8))[0]
            mask = self._read(4) if second & 0x80 else None
            payload = self._read(n)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if opcode == 0x9:  # ping
                self._send_frame(0xA, payload)
                continue
            if opcode == 0x8:
                raise CdpError("the browser closed the connection")
            if opcode in (0x1, 0x0):
                parts.append(payload)
                if first & 0x80:
                    return json.loads(b"".join(parts).decode())

    def call(self, method, **params):
        """Sends a command and returns its result, skipping the events that arrive meanwhile.
        The whole call, however many events come first, fails after `timeout` seconds (a
        browser that keeps sending events but never answers cannot hang the test)."""
        self.next_id += 1
        message_id = self.next_id
        self.deadline = time.monotonic() + self.timeout
        try:
            self._send_frame(0x1, json.dumps({"id": message_id, "method": method,
                                              "params": params}).encode())
            while True:
                message = self._receive_message()
                if message.get("id") == message_id:
                    if "error" in message:
                        raise CdpError("%s: %s" % (method, message["error"]))
                    return message.get("result", {})
        except socket.timeout:
            raise CdpError("%s: no answer within %ss (hang guard)" % (method, self.timeout))
        finally:
            self.deadline = None
            self.sock.settimeout(self.timeout)

    def evaluate(self, expression):
        """The value of a JavaScript expression in the page (awaiting it if it is a promise)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise CdpError("%s: %s" % (expression, result["exceptionDetails"]))
        return result["result"].get("value")

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
