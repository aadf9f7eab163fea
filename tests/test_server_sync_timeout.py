"""A weight sync against a server that hangs must raise at ``sync_timeout_s``, not several timeouts later
(issue 36 item 3). The server is a stdlib HTTP server on 127.0.0.1 that answers every request slowly: it
sends its headers at once and then one byte of its JSON body every 0.2 s for a minute, so no single read of
the client ever times out (``requests``' timeout is per read) and each request of the sync (reload, prefix-cache
reset, version set, version check) takes that minute. Before the fix the ``TimeoutError`` was raised only when
the sync's thread pool was left, which waited for the hung worker to finish all of its requests.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lit_rl.rollout._server_http import ServerPool

TIMEOUT = 3.0


@pytest.fixture
def slow_server():
    stop = threading.Event()

    class Slow(BaseHTTPRequestHandler):
        def _answer(self):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()  # HTTP/1.0 without a length: the body ends when the connection closes
            for _ in range(300):  # 60 s of whitespace, one byte per 0.2 s (valid before JSON)
                if stop.wait(0.2):
                    return
                try:
                    self.wfile.write(b" ")
                    self.wfile.flush()
                except OSError:
                    return
            self.wfile.write(b'{"success": true, "weight_version": "1"}')

        def do_GET(self):
            self._answer()

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._answer()

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        stop.set()
        httpd.shutdown()
        httpd.server_close()


def test_a_hung_server_fails_the_weight_sync_at_sync_timeout_s(slow_server, tmp_path):
    pool = ServerPool([slow_server], request_timeout_s=TIMEOUT)
    t0 = time.monotonic()
    with pytest.raises(
        TimeoutError, match=rf"server {slow_server}: weight sync exceeded sync_timeout_s={TIMEOUT}"
    ):
        pool.reload_from_file(str(tmp_path), "1", TIMEOUT)
    took = time.monotonic() - t0
    print(f"TimeoutError after {took:.2f} s (sync_timeout_s={TIMEOUT})")
    assert took < 3 * TIMEOUT, (
        took
    )  # a loaded 2-core machine's slack; before: > 60 s (the first request alone)
