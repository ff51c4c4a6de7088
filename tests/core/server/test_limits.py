"""Size, time and connection limits, on loopback with raw sockets and bounded loops.

Each limit is set small for the test (a 32 KiB body, half-second timeouts, three
connections) so the whole module runs in a few seconds; every wait has a deadline.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest
from draftwise.server.limits import ServerLimits
from server_fakes import SLOW, SLOW_TOKENIZE_S, FakeEngine, serving

LIMITS = ServerLimits(max_request_bytes=32768, header_timeout=0.6, body_timeout=0.6,
                      keep_alive_timeout=0.6, max_connections=64)
#: how long past a limit the server may take to act (a loaded 2-core machine)
SLACK = 3.0


@pytest.fixture(scope="module")
def engine() -> FakeEngine:
    return FakeEngine(step_delay=0.01)


@pytest.fixture(scope="module")
def server(engine: FakeEngine) -> Iterator[str]:
    with serving(engine, limits=LIMITS) as url:
        yield url


def connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=SLACK + 5)
    return sock


def read_until_closed(sock: socket.socket, deadline_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes; (bytes, seconds it took)."""
    t0 = time.monotonic()
    data = b""
    while time.monotonic() - t0 < deadline_s:
        sock.settimeout(max(0.05, deadline_s - (time.monotonic() - t0)))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            break
        if not chunk:
            return data, time.monotonic() - t0
        data += chunk
    raise AssertionError(f"the server did not close within {deadline_s}s (got {data[:200]!r})")


def parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def request_head(path: str, extra: str) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"{extra}\r\n").encode()


def test_declared_oversize_body_is_413_before_a_byte_is_read(server, engine):
    sock = connect(server)
    sock.sendall(request_head("/v1/completions", "content-length: 100000000\r\n") + b'{"a":')
    status, headers, body = parse(read_until_closed(sock, SLACK)[0])
    assert status == 413 and headers["connection"] == "close"
    error = json.loads(body)["error"]
    assert error["code"] == "request_too_large" and "32768" in error["message"]
    assert engine.requests == {}


def test_chunked_body_growing_past_the_limit_is_413(server):
    sock = connect(server)
    sock.sendall(request_head("/v1/completions", "transfer-encoding: chunked\r\n"))
    chunk = b'{"prompt": "' + b"x" * 1000
    try:
        for _ in range(64):  # 64 KB in 1 KB chunks; the server stops it past 32 KB
            sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            time.sleep(0.01)
    except (BrokenPipeError, ConnectionResetError):
        pass  # it already answered and closed
    status, _, body = parse(read_until_closed(sock, SLACK)[0])
    assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"


def test_a_large_ignored_field_is_refused_by_size_not_parsed(server):
    body = json.dumps({"prompt": "x", "user": "u" * 40_000}).encode()
    sock = connect(server)
    sock.sendall(request_head("/v1/completions", f"content-length: {len(body)}\r\n") + body)
    assert parse(read_until_closed(sock, SLACK)[0])[0] == 413


def test_a_body_that_trickles_gets_408_and_the_connection_closes(server):
    sock = connect(server)
    sock.sendall(request_head("/v1/completions", "content-length: 200\r\n") + b'{"prompt":')
    raw, seconds = read_until_closed(sock, LIMITS.body_timeout + SLACK)
    status, _, body = parse(raw)
    assert status == 408 and json.loads(body)["error"]["code"] == "request_timeout"
    assert seconds >= LIMITS.body_timeout * 0.9


def test_slowloris_headers_are_cut_at_the_header_deadline(server):
    sock = connect(server)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")
    t0 = time.monotonic()
    closed = False
    for _ in range(int((LIMITS.header_timeout + SLACK) / 0.1)):  # one byte every 0.1 s
        try:
            sock.sendall(b"x")
        except (BrokenPipeError, ConnectionResetError):
            closed = True
            break
        time.sleep(0.1)
        sock.settimeout(0.001)
        try:
            if sock.recv(65536, socket.MSG_PEEK):
                closed = True
                break
        except (BlockingIOError, TimeoutError):
            pass
        except ConnectionResetError:
            closed = True
            break
    assert closed, "a client trickling header bytes was never cut"
    assert time.monotonic() - t0 >= LIMITS.header_timeout * 0.9
    try:
        raw, _ = read_until_closed(sock, SLACK)
        assert parse(raw)[0] == 408
    except ConnectionResetError:
        pass  # the 408 may be lost to the reset our unread bytes cause


def test_a_connection_that_sends_nothing_is_closed(server):
    sock = connect(server)
    raw, seconds = read_until_closed(sock, LIMITS.header_timeout + SLACK)
    assert raw == b""  # nothing was asked, so nothing is answered
    assert seconds >= LIMITS.header_timeout * 0.9


def test_an_idle_keep_alive_connection_is_closed(server):
    sock = connect(server)
    sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    raw, seconds = read_until_closed(sock, LIMITS.keep_alive_timeout + SLACK)
    assert raw.startswith(b"HTTP/1.1 200")
    assert seconds >= LIMITS.keep_alive_timeout * 0.9


def test_connections_over_the_cap_get_503_not_a_hang(serve_fake):
    """Every slot inside a request (headers begun): the new connection gets the 503."""
    cap = ServerLimits(max_connections=3, header_timeout=30)
    with serve_fake(FakeEngine(), limits=cap) as url:
        busy = [connect(url) for _ in range(3)]  # hold every slot, each inside a request
        for sock in busy:
            sock.sendall(b"GET /health HTTP/1.1\r\n")
        time.sleep(0.2)
        over = connect(url)
        over.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        status, headers, body = parse(read_until_closed(over, SLACK)[0])
        assert status == 503 and headers["connection"] == "close"
        assert json.loads(body)["error"]["code"] == "too_many_connections"
        for sock in busy:
            sock.close()
        for _ in range(100):  # the slots free as the server sees the closes
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the server never took connections again")


def test_idle_sockets_at_the_cap_give_way_to_an_honest_client(serve_fake):
    """Silent sockets filling every slot are closed, oldest first, as clients with
    requests arrive: each honest request is served, at once, not after a timeout."""
    cap = ServerLimits(max_connections=8, header_timeout=30, first_byte_timeout=30)
    with serve_fake(FakeEngine(), limits=cap) as url:
        idle = []
        for _ in range(8):  # apart in time: connections accepted together are set up by
            idle.append(connect(url))  # asyncio tasks in any order, so "oldest" would be
            time.sleep(0.02)  # a coin toss between sockets opened in the same microsecond
        time.sleep(0.2)
        t0 = time.monotonic()
        with httpx.Client(timeout=SLACK + 5) as client:  # one kept-alive connection
            for _ in range(3):
                assert client.get(f"{url}/health").status_code == 200
            for _ in range(2):  # and a fresh one each time, at the cap again
                assert httpx.get(f"{url}/health", timeout=SLACK + 5).status_code == 200
        assert time.monotonic() - t0 < SLACK + 5  # never waited for a deadline
        closed = []
        for sock in idle:
            sock.settimeout(0.5)
            try:
                closed.append(sock.recv(1) == b"")
            except TimeoutError:
                closed.append(False)
            except ConnectionResetError:
                closed.append(True)
            sock.close()
        # the longest idle went first: the oldest sockets, as many as were needed
        assert closed[0] and closed[1], closed
        assert not all(closed), closed  # only as many as the honest clients needed


def test_a_silent_fresh_connection_is_closed_at_the_first_byte_deadline(serve_fake):
    """A socket that sends nothing is closed at --first-byte-timeout, well before the
    header deadline; one that has begun a request keeps to the header deadline."""
    limits = ServerLimits(header_timeout=30, first_byte_timeout=0.5)
    with serve_fake(FakeEngine(), limits=limits) as url:
        silent, begun = connect(url), connect(url)
        begun.sendall(b"GET /health HTTP/1.1\r\n")
        raw, seconds = read_until_closed(silent, limits.first_byte_timeout + SLACK)
        assert raw == b"" and seconds >= limits.first_byte_timeout * 0.9
        begun.settimeout(0.5)
        with pytest.raises(TimeoutError):  # still open: its headers have 30 s
            begun.recv(1)
        begun.sendall(b"host: x\r\n\r\n")
        status, _, _ = parse(begun.recv(65536))
        assert status == 200
        begun.close()


@pytest.mark.parametrize("where", ["user", "prompt", "messages"])
def test_3000_deep_json_is_a_named_400(server, where):
    deep = "[" * 3000 + "]" * 3000
    if where == "messages":
        body = '{"messages": [{"role": "user", "content": "x", "extra": ' + deep + "}]}"
        path = "/v1/chat/completions"
    else:
        body = '{"prompt": "x", "%s": %s}' % (where, deep) if where == "user" else \
            '{"prompt": ' + '{"a": ' * 3000 + "1" + "}" * 3000 + "}"
        path = "/v1/completions"
    r = httpx.post(f"{server}{path}", content=body.encode(),
                   headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "json_too_deep" and "64 levels" in error["message"]


def test_depth_within_the_limit_reaches_the_schema(server):
    body = '{"prompt": "x", "stream_options": ' + '{"a": ' * 40 + "1" + "}" * 40 + "}"
    r = httpx.post(f"{server}/v1/completions", content=body.encode(), timeout=10,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options.a"


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", rb'{"prompt": "a\ud800b"}', "prompt"),
    ("/v1/completions", b'{"prompt": "caf\xe9"}', "prompt"),  # latin-1, not UTF-8
    ("/v1/completions", b'{"prompt": "\xed\xa0\x80\xed\xb0\x80"}', "prompt"),  # CESU-8
    ("/v1/completions", rb'{"prompt": "x", "stop": ["ok", "\udc00"]}', "stop[1]"),
    ("/v1/completions", rb'{"prompt": [1, 2], "model": "\ud83d"}', "model"),
    ("/v1/chat/completions",
     rb'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]}',
     "messages[0].content[0].text"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\xff"}]}',
     "messages[0].content"),
    ("/v1/completions", rb'{"prompt": "x", "k\ud800": 1}', "k\\ud800"),
])
def test_invalid_text_is_a_400_naming_the_field(server, path, body, param):
    r = httpx.post(f"{server}{path}", content=body, timeout=10,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["code"] == "invalid_text"
    assert "lone surrogate" in error["message"]


def test_valid_surrogate_pairs_and_non_ascii_are_text(server):
    r = httpx.post(f"{server}/v1/completions", timeout=10, json={
        "prompt": "caf\u00e9 \U0001F600", "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200, r.text
    pair = rb'{"prompt": "\ud83d\ude00 ok", "max_tokens": 2}'
    r = httpx.post(f"{server}/v1/completions", content=pair, timeout=10,
                   headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text


def test_a_slow_to_tokenize_prompt_does_not_stall_a_running_stream(server, engine):
    """Tokenizing runs on a worker thread: the stream keeps its pace meanwhile."""
    times: list[float] = []
    body = {"prompt": "victim", "max_tokens": 250, "temperature": 0, "stream": True}

    def victim() -> None:
        with httpx.stream("POST", f"{server}/v1/completions", json=body, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    times.append(time.monotonic())

    reader = threading.Thread(target=victim)
    reader.start()
    for _ in range(500):
        if len(times) >= 5:
            break
        time.sleep(0.01)
    t0 = time.monotonic()
    r = httpx.post(f"{server}/v1/completions", timeout=30,
                   json={"prompt": f"big {SLOW}", "max_tokens": 2, "temperature": 0})
    t1 = time.monotonic()
    reader.join(30)
    assert r.status_code == 200 and t1 - t0 >= SLOW_TOKENIZE_S
    during = [t for t in times if t0 <= t <= t1]
    gaps = [b - a for a, b in zip(during, during[1:])]
    # on the engine thread the stream would stop for the whole SLOW_TOKENIZE_S
    assert len(during) > 10 and max(gaps) < SLOW_TOKENIZE_S / 2, (len(during), max(gaps))
    assert "draftwise-engine" not in engine.tokenize_threads
