"""Request bodies read as JSON with duplicate keys refused: ``json.loads`` silently keeps the
last of ``{"text": "the cat", "text": "dog"}`` (YAML configs refuse duplicate keys too).

``UniqueKeysRoute``, the API's route class (FastAPI's way to change how a route reads its
request), reads bodies with ``loads_unique``; FastAPI turns its ``JSONDecodeError`` into a
validation error, which ``errors.validation_message`` answers as a 400 ``bad_json`` naming the
key. A lone surrogate is refused here too, before validation (which refused some fields' and
not others')."""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute


class DuplicateKeyError(json.JSONDecodeError):
    """A JSON object that gives one key twice (its position is not known)."""

    def __init__(self, key: str):
        super().__init__(f"duplicate key {key!r} (send each key once)", "", 0)


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """The ``object_pairs_hook`` that refuses a repeated key."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(key)
        out[key] = value
    return out


def loads_unique(text: str | bytes) -> Any:
    """``json.loads(text)``, raising ``DuplicateKeyError`` for an object with a repeated key
    and ``UnicodeEncodeError`` for a lone surrogate (an escape such as "\\ud800") anywhere,
    keys included (``errors`` answers it as 400 ``bad_encoding``)."""
    data = json.loads(text, object_pairs_hook=unique_keys)
    json.dumps(data, ensure_ascii=False).encode("utf-8")
    return data


class UniqueKeysRequest(Request):
    """A request whose ``json()`` refuses duplicate keys."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads_unique(await self.body())
        return self._json


class UniqueKeysRoute(APIRoute):
    """An API route that reads its JSON body with ``UniqueKeysRequest``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def unique_keys_handler(request: Request) -> Response:
            return await handler(UniqueKeysRequest(request.scope, request.receive))

        return unique_keys_handler
