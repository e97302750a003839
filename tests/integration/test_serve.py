"""`gpulock serve` over real HTTP: every endpoint, the documents it serves against the CLI's,
what it hides from the network, bad and slow clients, and stopping on SIGTERM/SIGINT. The server
is a real process on a free loopback port; requests go through http.client and raw sockets (no
proxy in between)."""

import http.client
import json
import re
import signal
import socket
import time

from prometheus_client.parser import text_string_to_metric_families

from conftest import EX_USAGE
from gpulock_testing import HANG, wait_until


def start_serve(gl, env=None, listen="127.0.0.1:0"):
    server = gl.spawn("serve", "--listen", listen, env=env)
    server.wait_for_stderr("listening on http://")
    port = int(re.search(r"listening on http://[^ ]*:(\d+)/", server.stderr()).group(1))
    server.port = port
    return server


def get(port, path, method="GET", headers=None, body=None):
    """(status, headers dict with lower-case names, body bytes)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=HANG)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return (response.status, {k.lower(): v for k, v in response.getheaders()},
                response.read())
    finally:
        connection.close()


def raw(port, data, timeout=HANG):
    """Sends raw bytes and returns everything the server answers before closing."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        answer = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return answer
            answer += chunk


def without_times(doc):
    """A status document without what changes from one reading to the next."""
    doc = json.loads(json.dumps(doc))
    doc.pop("taken_at")
    for gpu in doc["gpus"]:
        gpu.pop("idle_since", None)
        gpu.pop("idle_seconds", None)
        if gpu["holder"]:
            gpu["holder"].pop("held_seconds")
    return doc


def test_every_endpoint_answers_with_the_clis_documents(gl):
    env = gl.env(fake="3")
    holder, lease_id = gl.hold("--gpus", "1", env=env, label="served")
    server = start_serve(gl, env=env)

    status, headers, body = get(server.port, "/api/status")
    assert status == 200 and headers["content-type"] == "application/json"
    served = json.loads(body)
    cli = gl.status(env=env)
    # The same document as `gpulock status --json`, except that the command line is cut to
    # the program's name (serve_show_commands is off).
    assert cli["gpus"][1]["holder"]["command"].startswith("sh -c ")
    assert served["gpus"][1]["holder"]["command"] == "sh"
    served["gpus"][1]["holder"]["command"] = cli["gpus"][1]["holder"]["command"]
    assert without_times(served) == without_times(cli)
    assert served["gpus"][1]["holder"]["lease_id"] == lease_id

    status, headers, body = get(server.port, "/api/queue")
    assert status == 200 and headers["content-type"] == "application/json"
    assert json.loads(body) == json.loads(gl.run("queue", "--json", env=env).stdout)

    status, headers, body = get(server.port, "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    leased = [s for s in families["gpulock_gpu_state"].samples
              if s.labels["state"] == "leased" and s.value == 1]
    assert [s.labels["gpu"] for s in leased] == ["1"]

    # The usage journal: the dashboard's chart (GPU-hours per user per UTC day) counts the
    # lease held above until now; a grouping of `gpulock usage` gives that command's document.
    status, headers, body = get(server.port, "/api/usage")
    assert status == 200 and headers["content-type"] == "application/json"
    chart = json.loads(body)
    assert chart["by"] == "user,day" and chart["available"] is True
    today = time.strftime("%Y-%m-%d", time.gmtime())
    mine = [r for r in chart["rows"] if r["day"] == today]
    assert len(mine) == 1 and mine[0]["gpu_hours"] > 0, chart
    status, _, body = get(server.port, "/api/usage?since=7d&by=label")
    assert status == 200
    served = json.loads(body)
    cli = json.loads(gl.run("usage", "--since", "7d", "--by", "label", "--json", env=env).stdout)
    assert [g["key"] for g in served["groups"]] == [g["key"] for g in cli["groups"]] == ["served"]
    for bad in ("/api/usage?by=nonsense", "/api/usage?since=yesterday-ish",
                "/api/usage?since=%00"):
        status, _, body = get(server.port, bad)
        assert status == 400 and "error" in json.loads(body), bad

    status, headers, body = get(server.port, "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert b'<script src="/dashboard.js"' in body and b"http" not in body.replace(
        b"http-equiv", b"")  # nothing from elsewhere: the page works offline
    assert "default-src 'self'" in headers["content-security-policy"]
    assert "base-uri 'none'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"
    for asset, kind in (("/dashboard.js", "text/javascript"), ("/dashboard.css", "text/css")):
        status, headers, body = get(server.port, asset)
        assert status == 200 and headers["content-type"].startswith(kind) and body

    status, headers, body = get(server.port, "/api/status", method="HEAD")
    assert status == 200 and body == b""


def test_full_command_lines_only_when_configured(gl):
    config = gl.tmp / "config.toml"
    config.write_text("serve_show_commands = true\n")
    env = gl.env(fake="2", GPULOCK_CONFIG=config)
    gl.hold("--gpus", "0", env=env)
    server = start_serve(gl, env=env)
    served = json.loads(get(server.port, "/api/status")[2])
    assert served["gpus"][0]["holder"]["command"].startswith("sh -c ")


def test_bad_requests_get_clean_errors_and_the_server_goes_on(gl):
    env = gl.env(fake="2")
    server = start_serve(gl, env=env)
    port = server.port

    status, headers, body = get(port, "/no/such/page")
    assert status == 404 and json.loads(body) == {"error": "no such page"}
    status, _, body = get(port, "/api/status", headers={"X-Huge": "x" * 100000})
    assert status in (400, 431) and "error" in json.loads(body)
    status, _, body = get(port, "/" + "a" * 20000)
    assert status in (400, 414) and "error" in json.loads(body)
    status, headers, body = get(port, "/api/status", method="POST", body=b"x")
    assert status == 405 and headers["allow"] == "GET, HEAD"
    assert raw(port, b"\x00\x01garbage\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    for method in ("PUT", "DELETE", "PATCH", "OPTIONS"):
        status, headers, body = get(port, "/api/status", method=method)
        assert status == 405 and "error" in json.loads(body), method
    # Assets are served by exact name only: no way out of them, nothing that merely looks alike.
    for path in ("/../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "/dashboard.js/../../x",
                 "/dashboardXjs", "/index.html/..", "//etc/passwd"):
        status, _, body = get(port, path)
        assert status == 404 and json.loads(body) == {"error": "no such page"}, path
    # Query strings the documents do not take, or cannot be decoded, are ignored, not fatal.
    for query in ("?since=abc", "?%zz=%", "?" + "&" * 2000, "?a=%00%ff"):
        status, _, body = get(port, "/api/status" + query)
        assert status == 200 and json.loads(body)["gpus"], query
        assert get(port, "/metrics" + query)[0] == 200

    # A slow client sends half a request and stalls: others are served meanwhile, and the
    # server drops the slow one after its read timeout instead of waiting for ever.
    slow = socket.create_connection(("127.0.0.1", port), timeout=HANG)
    try:
        slow.sendall(b"GET /api/status HTTP/1.1\r\nHost: x\r\n")
        assert get(port, "/api/status")[0] == 200
        started = time.monotonic()
        leftover = slow.recv(65536)
        while leftover and not leftover.endswith(b"}\n") and b"\r\n\r\n" not in leftover:
            leftover += slow.recv(65536)
        assert time.monotonic() - started < HANG
        # httplib closes without an answer, or answers 400: never a 200 for half a request.
        assert not leftover.startswith(b"HTTP/1.1 200")
    finally:
        slow.close()

    assert get(port, "/api/status")[0] == 200
    assert server.alive()


def test_idle_connections_do_not_hold_up_the_others(gl):
    """Connections that send nothing (a browser's preconnected sockets, a stalled client) each
    hold a thread until the server's 5 s read timeout drops them. With a fixed pool of N threads,
    N of them made every other request wait for that timeout. Checked by order of events, not by
    time: the request is answered while every idle connection is still open, i.e. before the
    server has dropped any of them."""
    server = start_serve(gl, env=gl.env(fake="2"))
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=HANG) for _ in range(48)]
    try:
        assert get(server.port, "/api/status")[0] == 200
        for s in idle:
            s.setblocking(False)
            try:
                dropped = s.recv(1) == b""
            except BlockingIOError:
                dropped = False
            assert not dropped, "the answer came only after the server dropped idle connections"
    finally:
        for s in idle:
            s.close()
    assert server.alive()


def test_on_loopback_only_loopback_host_names_are_answered(gl):
    """DNS rebinding: a page from elsewhere whose name a browser was made to resolve to
    127.0.0.1 sends its own name as Host; the server must not hand it the documents."""
    server = start_serve(gl, env=gl.env(fake="2"))
    for host in ("127.0.0.1:%d" % server.port, "localhost:%d" % server.port, "LOCALHOST",
                 "[::1]:%d" % server.port, "127.0.0.2"):
        assert get(server.port, "/api/status", headers={"Host": host})[0] == 200, host
    for host in ("evil.example:%d" % server.port, "evil.example", "127.0.0.1.evil.example",
                 "[::2]:80", "localhost.evil.example"):
        for path in ("/api/status", "/metrics", "/"):
            status, _, body = get(server.port, path, headers={"Host": host})
            assert status == 403 and "loopback" in json.loads(body)["error"], (host, path)
    assert server.alive()


def test_sigterm_and_sigint_stop_it_cleanly(gl):
    env = gl.env(fake="2")
    for sig in (signal.SIGTERM, signal.SIGINT):
        server = start_serve(gl, env=env)
        assert get(server.port, "/api/status")[0] == 200
        server.popen.send_signal(sig)
        assert server.wait() == 0
        assert "gpulock serve: stopped" in server.stderr()
        try:
            get(server.port, "/api/status")
            raise AssertionError("still answering after %s" % sig)
        except OSError:
            pass


def test_listen_errors_are_clear(gl):
    env = gl.env(fake="2")
    for bad in ("9400", "127.0.0.1:99999", "127.0.0.1:http", "::1:9400"):
        result = gl.run("serve", "--listen", bad, env=env)
        assert result.returncode == EX_USAGE, (bad, result.stderr)
        assert "--listen" in result.stderr
    taken = start_serve(gl, env=env)
    result = gl.run("serve", "--listen", "127.0.0.1:%d" % taken.port, env=env)
    assert result.returncode == 69
    assert "cannot listen on 127.0.0.1:%d" % taken.port in result.stderr
    assert taken.alive()


def test_a_non_loopback_address_is_warned_about(gl):
    server = start_serve(gl, env=gl.env(fake="2"), listen="0.0.0.0:0")
    wait_until(lambda: "reachable from the network" in server.stderr(),
               what="the network warning")


def test_completion_offers_listen_addresses_and_the_new_commands(gl):
    result = gl.run("__complete", "--", "serve", "--listen", "")
    assert result.returncode == 0
    assert [line.split("\t")[0] for line in result.stdout.splitlines()] == [
        "127.0.0.1:9400", "0.0.0.0:9400"]
    commands = [line.split("\t")[0] for line in gl.run("__complete", "--", "").stdout.splitlines()]
    assert "metrics" in commands and "serve" in commands


def test_failed_readings_answer_503_until_they_recover(gl):
    path = gl.write_fake_gpus([{}, {}])
    server = start_serve(gl, env=gl.env(fake=path))
    assert get(server.port, "/api/status")[0] == 200
    gl.write_fake_gpus([{"utilization": 250}])  # impossible: the source refuses the file

    def refused():
        status, _, body = get(server.port, "/api/status")
        return body if status == 503 else None
    body = wait_until(refused, what="/api/status to answer 503")
    assert "utilization" in json.loads(body)["error"]
    assert get(server.port, "/metrics")[0] == 503
    gl.write_fake_gpus([{}, {}, {}])
    wait_until(lambda: get(server.port, "/api/status")[0] == 200, what="/api/status to recover")
    assert len(json.loads(get(server.port, "/api/status")[2])["gpus"]) == 3
    assert server.alive()
