"""The API key: its two headers, declared for the OpenAPI schema (the Authorize button of
/docs), and the check of a request against the key. Imported by the app only, so that the CLI
starts without FastAPI's security modules."""

from __future__ import annotations

import hmac

from fastapi import Request
from fastapi.security import APIKeyHeader, HTTPBearer

from xinda.serve.errors import ApiError

API_KEY = APIKeyHeader(name="X-API-Key", auto_error=False, description="the --api-key")
BEARER = HTTPBearer(auto_error=False, description="the --api-key as a Bearer token")


def check_api_key(request: Request, key: str | None) -> None:
    """With a ``key`` set: the request must give it (X-API-Key or Authorization: Bearer)."""
    if key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    given = request.headers.get("x-api-key") or (
        token.strip(" \t") if scheme.lower() == "bearer" else "")  # the scheme: any case;
    # HTTP's blanks only: str.strip() also took "\x85" and "\xa0", bytes of UTF-8 ("à")
    # header values arrive decoded as Latin-1: their bytes are what the client sent
    if not hmac.compare_digest(given.encode("latin-1"), key.encode("utf-8")):
        raise ApiError(401, "unauthorized", "a valid API key is required (header "
                       "X-API-Key or Authorization: Bearer)", {"WWW-Authenticate": "Bearer"})
