"""Refusals as JSON: ``{"error": {"code": ..., "message": ...}}`` with a 4xx status, for every
way a request can go wrong (the app's own ``ApiError``, FastAPI's validation, Starlette's 404 and
405, a library ``XindaError``); anything else becomes a 500 of the same shape in
``middleware.RequestGuard``, never a crash."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.routing import Match

from xinda.errors import XindaError

MAX_MESSAGE = 300  # characters of an error message
HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")  # what a 405 may allow
UNION_TAGS = {"str", "int", "float", "bool", "list", "dict"}  # pydantic's union member names


class ApiError(Exception):
    """A refusal: HTTP ``status``, a short ``code`` and a one-line ``message``."""

    def __init__(self, status: int, code: str, message: str,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers


def one_line(text: str) -> str:
    """``text`` on one line (unprintable characters escaped), cut to MAX_MESSAGE characters."""
    flat = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return flat if len(flat) <= MAX_MESSAGE else flat[:MAX_MESSAGE - 3] + "..."


def error_response(status: int, code: str, message: str,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": one_line(message)}},
                        status_code=status, headers=headers)


def field_path(loc: tuple) -> str:
    """A pydantic error location as a field path: ("body", "text", 2) -> "text[2]"."""
    path = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part not in UNION_TAGS and "[" not in str(part):
            path += f".{part}" if path else str(part)
    return path


def validation_message(err: RequestValidationError) -> tuple[int, str, str]:
    """(status, code, message) of FastAPI's validation error: its deepest error (of a union's
    alternatives, the one that got furthest, and of those not a wrong type: a list too long
    rather than "not a string"), by field."""
    first = max(err.errors(), key=lambda e: (len(e.get("loc", ())),
                                            not str(e.get("type")).endswith("_type")))
    if first.get("type") == "json_invalid":
        reason = first.get("ctx", {}).get("error", "not valid JSON")
        return 400, "bad_json", f"the request body is not valid JSON: {reason}"
    loc = tuple(first.get("loc", ()))
    if first.get("type") == "extra_forbidden":  # the key as sent, not read as a field path
        parent, unknown = field_path(loc[:-1]), f"unknown field {loc[-1]!r}"
        return 422, "invalid_request", f"{parent}: {unknown}" if parent else unknown
    path = field_path(loc)
    if not path and first.get("type") == "missing":
        return 422, "invalid_request", "the request body is missing: send a JSON object"
    if not path:
        return 422, "invalid_request", f"the request body must be a JSON object: {first['msg']}"
    return 422, "invalid_request", f"{path}: {first['msg'].removeprefix('Value error, ')}"


def allowed_methods(request: Request) -> str:
    """The Allow header of a 405: the methods some route answers on the request's path
    (routing names only the first matching route's: GET, not the HEAD route beside it)."""
    routes = request.app.router.routes
    return ", ".join(method for method in METHODS if any(
        route.matches({**request.scope, "method": method})[0] == Match.FULL for route in routes))


def install_error_handlers(app: FastAPI) -> None:
    """Map every exception a request can raise to the JSON error shape."""

    @app.exception_handler(ApiError)
    async def api_error(_: Request, err: ApiError) -> JSONResponse:
        return error_response(err.status, err.code, err.message, err.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        return error_response(*validation_message(err))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException) -> JSONResponse:
        if err.status_code == 400 and isinstance(err.__cause__, UnicodeEncodeError):
            return error_response(400, "bad_encoding", "the request holds a lone surrogate "
                                  "(\\ud800-\\udfff): not valid Unicode text")
        if err.status_code == 400 and isinstance(err.__cause__, (RecursionError, ValueError)):
            return error_response(400, "bad_json", "the request body could not be parsed as "
                                  "JSON: nested too deeply or a number too long")
        code = HTTP_CODES.get(err.status_code, "http_error")
        headers = err.headers
        if err.status_code == 405:  # (routing names the first route's methods only)
            headers = {**(headers or {}), "Allow": allowed_methods(request)}
        return error_response(err.status_code, code, str(err.detail), headers)

    @app.exception_handler(XindaError)
    async def library_error(_: Request, err: XindaError) -> JSONResponse:
        return error_response(422, "invalid_request", str(err))
