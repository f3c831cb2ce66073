"""ASGI middleware in front of the app: request metrics, the Host check of a server without an
API key (loopback names only: a site whose name resolves here, by DNS rebinding, could use it
from a browser), the body checks that must happen before FastAPI reads the body (a body over
``max_body_bytes`` is a 413 without being read whole; a body that is not declared JSON is a
415, one that is not UTF-8 a 400; and, before them, a missing API key: a 401 before the body
is read or parsed), and the 500 of an unexpected exception (here, inside the
CORS middleware, so that it carries CORS headers too)."""

from __future__ import annotations

import logging
import time

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from xinda.serve.auth import check_api_key
from xinda.serve.errors import ApiError, error_response
from xinda.serve.metrics import Metrics

CLIENT_GONE = 499  # the status of a request whose client left before its answer (nginx's)
log = logging.getLogger("xinda")


class RequestGuard:
    """Counts and times every HTTP request, refuses bodies that are too large, not sent as JSON
    or not UTF-8, and answers an unexpected exception with a 500, all in the JSON error
    shape."""

    def __init__(self, app: ASGIApp, metrics: Metrics, max_body_bytes: int,
                 body_paths: frozenset[str] = frozenset(), hosts: frozenset[str] | None = None,
                 api_key: str | None = None):
        """``body_paths``: the paths whose POST bodies are checked (any other request goes on
        as it came: routing answers a wrong method with 405, an unknown path with 404);
        ``hosts``: the host names a request may name (None: any); ``api_key``: the key a
        POST to ``body_paths`` must give before its body is read."""
        self.app, self.metrics, self.max_body_bytes = app, metrics, max_body_bytes
        self.body_paths, self.hosts, self.api_key = body_paths, hosts, api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), [0]  # 0: no response started yet

        async def send_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        self.metrics.in_flight.inc()
        try:
            if self.hosts is not None and (host := host_name(scope)) not in self.hosts:
                names = ", ".join(sorted(self.hosts - {""}))
                await error_response(400, "bad_host", f"Host {host!r}: without an API key this "
                                     f"server answers requests to {names} only (--api-key "
                                     "allows others)")(scope, receive, send_status)
            elif scope["method"] == "POST" and scope["path"] in self.body_paths:
                if refusal := self._unauthorized(scope):
                    await refusal(scope, receive, send_status)
                elif not await self._with_body(scope, receive, send_status):
                    status[0] = CLIENT_GONE
            else:
                await self.app(scope, receive, send_status)
        except Exception as err:
            if status[0]:  # the response has started: nothing else can be sent
                raise
            log.exception("xinda serve: internal error")
            await error_response(500, "internal", f"internal error: {type(err).__name__}")(
                scope, receive, send_status)
        finally:
            self.metrics.in_flight.dec()
            self.metrics.request(scope["path"], status[0] or 500, time.perf_counter() - start)

    def _unauthorized(self, scope: Scope):
        """The 401 of a request without the API key (``check_api_key``), or None."""
        try:
            check_api_key(Request(scope), self.api_key)
        except ApiError as err:
            return error_response(err.status, err.code, err.message, err.headers)
        return None

    async def _with_body(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Read the body (at most ``max_body_bytes``), check it, hand it on; False when the
        client disconnected before sending all of it."""
        refusal = self._declared_too_large(scope)
        chunks, size, more = [], 0, refusal is None
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return False
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.max_body_bytes:
                refusal = self._too_large()
                break
        body = b"".join(chunks)
        if refusal is None and body and not _is_json_type(scope):
            refusal = error_response(415, "unsupported_media_type", "the request body must be "
                                     "JSON: send Content-Type: application/json")
        if refusal is None and not _is_utf8(body):
            refusal = error_response(400, "bad_encoding", "the request body is not valid UTF-8")
        if refusal is None and b"\x00" in body:  # (valid UTF-8, and what json.loads would read
            refusal = error_response(  # as UTF-16 or UTF-32: JSON holds no raw NUL)
                400, "bad_encoding", "the request body holds NUL bytes: send JSON as UTF-8, "
                "not UTF-16 or UTF-32")
        if refusal is not None:
            await refusal(scope, receive, send)
            return True
        await self.app(scope, _replay(body, receive), send)
        return True

    def _declared_too_large(self, scope: Scope):
        """The 413 response when the Content-Length header is over the limit (or bad)."""
        length = dict(scope["headers"]).get(b"content-length")
        if length is None:
            return None
        if not length.isdigit():
            return error_response(400, "bad_request", "bad Content-Length header")
        return self._too_large() if int(length) > self.max_body_bytes else None

    def _too_large(self):
        return error_response(413, "too_large", f"the request body is over "
                              f"{self.max_body_bytes} bytes", {"Connection": "close"})


def host_name(scope: Scope) -> str:
    """The host name of the request's Host header, lower case, without port or IPv6 brackets
    ("" without the header)."""
    host = dict(scope["headers"]).get(b"host", b"").decode("latin-1").strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.partition(":")[0]


def _is_json_type(scope: Scope) -> bool:
    """Whether the Content-Type is one FastAPI reads as JSON: application/json or
    application/*+json (parameters such as charset aside)."""
    value = dict(scope["headers"]).get(b"content-type", b"").decode("latin-1")
    kind, _, subtype = value.split(";")[0].strip().lower().partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


def _is_utf8(body: bytes) -> bool:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` once, then what ``receive`` gives (disconnects)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}
    return replay


class JsonCORS(CORSMiddleware):
    """Starlette's CORS middleware (outermost: the guard's refusals get CORS headers too), with
    its refused preflights in the JSON error shape (before: plain text) and every preflight,
    which it answers itself, counted in the metrics as the guard counts the rest."""

    def __init__(self, app: ASGIApp, metrics: Metrics, **options):
        super().__init__(app, **options)
        self.metrics = metrics

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code == 200:
            return response
        cors = {k: v for k, v in response.headers.items() if k.startswith("access-control-")}
        return error_response(response.status_code, "cors_refused",
                              f"CORS preflight refused: {response.body.decode()}", cors)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope) if scope["type"] == "http" else {}
        if not (scope.get("method") == "OPTIONS" and "origin" in headers
                and "access-control-request-method" in headers):  # (not a preflight)
            await super().__call__(scope, receive, send)
            return
        start, status = time.perf_counter(), [500]

        async def send_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        await super().__call__(scope, receive, send_status)
        self.metrics.request(scope["path"], status[0], time.perf_counter() - start)
