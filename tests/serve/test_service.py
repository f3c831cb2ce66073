"""The server's behaviour under load and its guards, through TestClient: batching across
concurrent requests (and switching it off), the bounded queue (429 with Retry-After), the
per-request timeout (504), the API key, CORS, and the Prometheus metrics."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from xinda.serve.app import create_app
from xinda.serve.settings import ServeSettings

LINES = ["one", "two hundred", "three thousand", "forty-two", "seven", "ninety nine"]


def metric(client, name: str, **labels: str) -> float:
    """The value of one sample of /metrics (0 when absent)."""
    text = client.get("/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = rf"^{name}{{{want}}} (\S+)$" if labels else rf"^{name} (\S+)$"
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def translate_concurrently(client, lines: list[str]) -> list[dict]:
    with ThreadPoolExecutor(len(lines)) as pool:
        responses = list(pool.map(lambda line: client.post(
            "/v1/translate", json={"text": line, "beam": 2}), lines))
    assert [r.status_code for r in responses] == [200] * len(lines)
    return [r.json()["translations"][0] for r in responses]


def test_concurrent_requests_share_batches_with_the_same_results(make_client):
    with make_client(max_wait_ms=500) as client:
        alone = [client.post("/v1/translate", json={"text": line, "beam": 2}).json()
                 ["translations"][0] for line in LINES]
        before = metric(client, "xinda_batch_requests_count", model="numbers")
        together = translate_concurrently(client, LINES)
        batches = metric(client, "xinda_batch_requests_count", model="numbers") - before
        assert batches < len(LINES)  # some requests were decoded together
        assert metric(client, "xinda_batch_requests_sum", model="numbers") == 2 * len(LINES)
        assert [t["nbest"][0]["text"] for t in together] == [t["nbest"][0]["text"]
                                                              for t in alone]


def test_batching_can_be_switched_off(make_client):
    with make_client(max_batch_requests=1, max_wait_ms=500) as client:
        translate_concurrently(client, LINES)
        assert metric(client, "xinda_batch_requests_count", model="numbers") == len(LINES)
        assert metric(client, "xinda_batch_requests_sum", model="numbers") == len(LINES)


def test_different_options_are_not_mixed(make_client):
    with make_client(max_wait_ms=300) as client, ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda k: client.post("/v1/translate", json={
            "text": "three thousand", "beam": 3, "n_best": 1 + k % 2}).json(), range(4)))
    assert [len(r["translations"][0]["nbest"]) for r in results] == [1, 2, 1, 2]


def test_a_full_queue_is_429_and_a_slow_answer_504(make_client):
    """With the workers stopped, a first request waits in the queue until its timeout; the
    queue (size 1) is full meanwhile."""
    with make_client(start=False, queue_size=1, timeout_s=1.0, retry_after_s=3) as client, \
            ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(client.post, "/v1/translate", json={"text": "one"})
        for _ in range(500):  # bounded: until the first job is queued
            if metric(client, "xinda_queue_depth", model="numbers") == 1:
                break
            time.sleep(0.01)
        full = client.post("/v1/translate", json={"text": "two"})
        assert full.status_code == 429 and full.json()["error"]["code"] == "queue_full"
        assert full.headers["retry-after"] == "3"
        late = waiting.result(timeout=30)
        # (not 408, Request Timeout: Chromium sent the POST again, twice: found by review)
        assert late.status_code == 504 and late.json()["error"]["code"] == "timeout"
        # the timed-out job no longer waits (before: it kept its place, found by review)
        assert metric(client, "xinda_queue_depth", model="numbers") == 0


def test_api_key(make_client):
    with make_client(api_key="s3cret") as client:
        assert client.get("/health").status_code == 200  # open: load balancers poll it
        for headers in ({}, {"X-API-Key": "wrong"}, {"Authorization": "Bearer wrong"}):
            response = client.post("/v1/translate", json={"text": "one"}, headers=headers)
            assert response.status_code == 401
            assert response.json()["error"]["code"] == "unauthorized"
        assert client.get("/v1/models").status_code == 401
        assert client.get("/metrics").status_code == 401
        for headers in ({"X-API-Key": "s3cret"}, {"Authorization": "Bearer s3cret"},
                        {"Authorization": "bearer s3cret"}):  # the scheme in any case
            assert client.post("/v1/translate", json={"text": "one"},
                               headers=headers).status_code == 200


def test_a_body_without_the_api_key_is_not_read(make_client):
    """Before: FastAPI parsed the body before the key's check, so anyone could have 1 MiB of
    JSON parsed and learn about the parser (400 bad_json, 413) (found by review)."""
    with make_client(api_key="s3cret") as client:
        for body in (b'{"text":', b'{"text": "a", "text": "b"}', b"[" * 100_000,
                     b'{"text": "\\ud800"}'):
            response = client.post("/v1/translate", content=body,
                                   headers={"content-type": "application/json"})
            assert response.status_code == 401, body[:20]
            assert response.headers["www-authenticate"] == "Bearer"
        response = client.post("/v1/translate", content=b'{"text":', headers={
            "content-type": "application/json", "X-API-Key": "s3cret"})
        assert response.json()["error"]["code"] == "bad_json"


def test_a_non_ascii_api_key_matches_its_utf8_bytes(make_client):
    """Before: the header (decoded as Latin-1) was re-encoded as UTF-8: never equal."""
    with make_client(api_key="sécret") as client:
        for headers in ({"X-API-Key": "sécret".encode()},
                        {"Authorization": "Bearer sécret".encode()}):
            assert client.get("/v1/models", headers=headers).status_code == 200
        assert client.get("/v1/models", headers={"X-API-Key": b"secret"}).status_code == 401


@pytest.mark.parametrize("key", ["voilà", "Å", "ą", "丠"])
def test_a_bearer_key_whose_utf8_ends_in_0x85_or_0xa0_matches(make_client, key):
    """Their last byte, read as Latin-1, is "\x85" or "\xa0", which str.strip() took off the
    Bearer token: before, a 401 (found by review)."""
    with make_client(api_key=key) as client:
        headers = {"Authorization": f"Bearer {key}".encode()}
        assert client.get("/v1/models", headers=headers).status_code == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.2"])
def test_without_an_api_key_only_loopback_host_names_are_served(make_client, host):
    """A site whose name resolves to 127.0.0.1 (DNS rebinding) is the page's origin to the
    browser: before, it could translate and read /metrics through the user's server."""
    with make_client() as client:
        for name in ("localhost:8000", "127.0.0.1", "[::1]:8000", "LOCALHOST"):
            assert client.get("/v1/models", headers={"Host": name}).status_code == 200
        response = client.post("/v1/translate", json={"text": "one"}, headers={"Host": host})
        assert response.status_code == 400 and response.json()["error"]["code"] == "bad_host"
        assert "127.0.0.1, ::1, localhost only (--api-key allows others)" in response.text
        assert client.get("/metrics", headers={"Host": host}).status_code == 400
    with make_client(api_key="k") as client:  # a key: any name (a proxy, another machine)
        assert client.get("/v1/models", headers={"Host": host, "X-API-Key": "k"}).status_code \
            == 200


@pytest.mark.parametrize("key", ["", " s3cret", "s3cret\t", "s3\ncret"])
def test_an_api_key_a_header_cannot_carry_is_refused(key):
    """Before: accepted, and every request was a 401 (HTTP strips the blanks around a header
    value)."""
    with pytest.raises(ValueError, match="API key must be printable"):
        ServeSettings(api_key=key)


def test_cors_is_off_unless_configured(make_client):
    origin = {"Origin": "http://example.test"}
    with make_client() as client:
        assert "access-control-allow-origin" not in client.get("/health", headers=origin).headers
    with make_client(cors_origins=("http://example.test",)) as client:
        headers = client.get("/health", headers=origin).headers
        assert headers["access-control-allow-origin"] == "http://example.test"
        other = client.get("/health", headers={"Origin": "http://evil.test"}).headers
        assert "access-control-allow-origin" not in other
        refused = client.post("/v1/translate", content=b'{"text": "one"}',
                              headers={**origin, "Content-Type": "text/plain"})
        assert refused.status_code == 415  # before: the guard's refusals had no CORS header
        assert refused.headers["access-control-allow-origin"] == "http://example.test"


@pytest.mark.parametrize(("preflight", "why"), [
    ({"Origin": "http://evil.test", "Access-Control-Request-Method": "POST"},
     "Disallowed CORS origin"),
    ({"Access-Control-Request-Method": "PUT"}, "Disallowed CORS method"),
    ({"Access-Control-Request-Headers": "x-custom"}, "Disallowed CORS headers")])
def test_a_refused_cors_preflight_is_a_counted_json_error(make_client, preflight, why):
    """Before: plain text from Starlette, and not in the metrics (found by review)."""
    asked = {"Origin": "http://example.test", "Access-Control-Request-Method": "POST",
             **preflight}
    with make_client(cors_origins=("http://example.test",)) as client:
        ok = client.options("/v1/translate", headers={"Origin": "http://example.test",
                                                      "Access-Control-Request-Method": "POST"})
        assert ok.status_code == 200
        refused = client.options("/v1/translate", headers=asked)
        assert refused.status_code == 400
        assert refused.json()["error"] == {"code": "cors_refused",
                                           "message": f"CORS preflight refused: {why}"}
        for status in ("200", "400"):
            assert metric(client, "xinda_requests_total", endpoint="/v1/translate",
                          status=status) == 1


def test_an_unexpected_error_is_a_json_500_with_cors_headers(make_client, monkeypatch):
    """Before: Starlette's outermost error handler answered it, outside the CORS middleware,
    so a browser on another origin could not read the error."""
    from xinda.serve import tasks

    def broken(*_args):
        raise RuntimeError("a bug")
    monkeypatch.setattr(tasks, "translation_json", broken)
    origin = {"Origin": "http://example.test"}
    with make_client(cors_origins=("http://example.test",)) as client:
        response = client.post("/v1/translate", json={"text": "one"}, headers=origin)
        assert response.status_code == 500
        assert response.json()["error"] == {"code": "internal",
                                            "message": "internal error: RuntimeError"}
        assert response.headers["access-control-allow-origin"] == "http://example.test"
        assert metric(client, "xinda_requests_total", endpoint="/v1/translate",
                      status="500") == 1
        assert client.post("/v1/translate", json={"text": "one", "beam": 0}).status_code == 422


def test_a_client_that_disconnects_abandons_its_job(make_client, monkeypatch):
    """Before: the job was decoded to its end for nobody, holding up the requests behind it."""
    import asyncio
    import threading

    from xinda.decode.search import check_stop
    from xinda.serve import tasks

    started = threading.Event()

    def translate(_translator, _options, inputs):  # steps like a search until stopped
        started.set()
        for _ in range(10_000):
            check_stop()
            time.sleep(0.001)
        return [[] for _ in inputs]
    monkeypatch.setitem(tasks.RUNNERS, "translate", translate)
    body = b'{"text": "one"}'
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent = []

    async def receive():
        if messages:
            return messages.pop()
        await asyncio.to_thread(started.wait, 10)  # the client leaves once decoding started
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/translate", "raw_path": b"",
             "root_path": "", "query_string": b"", "scheme": "http", "http_version": "1.1",
             "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1),
             "headers": [(b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}
    with make_client() as client:  # starts the workers
        asyncio.run(client.app(scope, receive, send))
        assert started.is_set()
        assert sent[0]["status"] == 499
        for _ in range(500):  # bounded: until the worker has counted the stopped batch
            if metric(client, "xinda_stopped_batches_total", model="numbers"):
                break
            time.sleep(0.01)
        assert metric(client, "xinda_stopped_batches_total", model="numbers") == 1


def test_metrics(make_client):
    with make_client() as client:
        client.post("/v1/translate", json={"text": ["one", "two"]})
        client.post("/v1/translate", json={"text": 5})
        client.get("/nothing/here")
        text = client.get("/metrics")
        assert text.headers["content-type"].startswith("text/plain")
        assert metric(client, "xinda_requests_total", endpoint="/v1/translate",
                      status="200") == 1
        assert metric(client, "xinda_requests_total", endpoint="/v1/translate",
                      status="422") == 1
        assert metric(client, "xinda_requests_total", endpoint="other", status="404") == 1
        assert metric(client, "xinda_request_seconds_count", endpoint="/v1/translate") == 2
        assert metric(client, "xinda_queue_depth", model="numbers") == 0
        assert metric(client, "xinda_batch_sentences_sum", model="numbers") == 2
        assert metric(client, "xinda_sentences_total", model="numbers") == 2
        assert metric(client, "xinda_sentences_per_second", model="numbers") > 0


def test_apps_have_their_own_metrics(served_models):
    """Two apps in one process: separate registries, no clash."""
    apps = [create_app({"numbers": served_models["numbers"]}) for _ in range(2)]
    assert apps[0].state.service.metrics.registry is not apps[1].state.service.metrics.registry


@pytest.mark.parametrize("bad", [
    {"max_batch_requests": 0}, {"timeout_s": 0}, {"port": 70000}, {"extra": 1},
    {"timeout_s": float("inf")}, {"timeout_s": float("nan")}, {"timeout_s": 1e9},
    {"max_wait_ms": float("inf")}, {"max_wait_ms": float("nan")}, {"max_wait_ms": 1e9},
    {"max_wait_ms": 30_000}, {"max_wait_ms": 1000, "timeout_s": 1.0}, {"max_work": 0}])
def test_settings_are_checked(bad):
    with pytest.raises(ValueError):
        ServeSettings(**bad)


def test_a_client_gone_before_its_body_is_not_a_server_error():
    """Before: a client that disconnected mid-body was counted as a 500."""
    import asyncio

    from xinda.serve.metrics import Metrics
    from xinda.serve.middleware import CLIENT_GONE, RequestGuard

    async def app(scope, receive, send):
        pytest.fail("the app ran without a body")

    messages = iter([{"type": "http.request", "body": b'{"te', "more_body": True},
                     {"type": "http.disconnect"}])

    async def receive():
        return next(messages)

    async def send(message):
        pytest.fail("nothing to answer")

    metrics = Metrics({"/v1/translate"})
    scope = {"type": "http", "method": "POST", "path": "/v1/translate",
             "headers": [(b"content-type", b"application/json")]}
    asyncio.run(RequestGuard(app, metrics, 1000, frozenset({"/v1/translate"}))(
        scope, receive, send))
    text = metrics.render().decode()
    assert f'endpoint="/v1/translate",status="{CLIENT_GONE}"}} 1.0' in text
    assert 'status="500"' not in text
