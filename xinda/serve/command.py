"""``xinda serve``: the command's options (``xinda.cli`` registers it); every default comes
from ``ServeSettings``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from xinda.errors import XindaError
from xinda.serve.settings import ServeSettings


def _serve_default(name: str):
    """The default of ``ServeSettings.<name>`` (each server default is defined once, there)."""
    return ServeSettings.model_fields[name].default


def serve(
    model_dirs: Annotated[list[Path], typer.Argument(help="trained model directories, served "
                                                      "by their directory name")],
    host: Annotated[str, typer.Option(help="address to bind; any but loopback needs an API "
                                      "key")] = _serve_default("host"),
    port: Annotated[int, typer.Option(help="port (0: any free one)")] = _serve_default("port"),
    api_key: Annotated[str | None, typer.Option(
        envvar="XINDA_API_KEY", show_envvar=True,
        help="require this key (header X-API-Key or Authorization: Bearer)")] = None,
    cors_origin: Annotated[list[str] | None, typer.Option(
        help="allow browser requests from this origin (repeat the option); default: no CORS")
        ] = None,
    max_batch_requests: Annotated[int, typer.Option(
        help="requests decoded together at most (1 = no batching across requests)")
        ] = _serve_default("max_batch_requests"),
    no_batching: Annotated[bool, typer.Option(
        "--no-batching", help="decode each request alone (--max-batch-requests 1)")] = False,
    batch_tokens: Annotated[int, typer.Option(help="source tokens per batch at most")
                            ] = _serve_default("batch_tokens"),
    max_wait_ms: Annotated[float, typer.Option(help="how long a batch waits for more requests")
                           ] = _serve_default("max_wait_ms"),
    queue_size: Annotated[int, typer.Option(help="waiting requests per model (beyond: 429)")
                          ] = _serve_default("queue_size"),
    timeout: Annotated[float, typer.Option(help="seconds per request (beyond: 504)")
                       ] = _serve_default("timeout_s"),
    max_texts: Annotated[int, typer.Option(help="texts per request")
                         ] = _serve_default("max_texts"),
    max_chars: Annotated[int, typer.Option(
        help="characters per text (or of its NFKC form, if more)")
                         ] = _serve_default("max_chars"),
    max_body_bytes: Annotated[int, typer.Option(help="request body size (beyond: 413)")
                              ] = _serve_default("max_body_bytes"),
    max_work: Annotated[int, typer.Option(
        help="decoder steps per request: texts x beam (or samples) x output length limit")
        ] = _serve_default("max_work"),
    max_attention: Annotated[int, typer.Option(
        help="attention weights per response that asks for them: outputs x output length "
             "limit x source tokens")] = _serve_default("max_attention"),
    device: Annotated[str, typer.Option(help="cpu | cuda | ...")] = "cpu",
    threads: Annotated[int, typer.Option(help="torch threads (0 = default)")] = 0,
    precision: Annotated[str | None, typer.Option(
        help="fp32 | bf16 | int8 | auto (default: each model's decode.precision)")] = None,
    int8_scale: Annotated[str | None, typer.Option(
        help="int8 activation scales: batch (fastest; an output can change with the requests "
             "batched with it) | row (not by their ranges; ~1.15x slower) (default: each "
             "model's decode.int8_scale)")
        ] = None,
) -> None:
    """Serve trained models over HTTP (REST API, batching across requests, web page at /)."""
    from pydantic import ValidationError

    from xinda.config import format_validation_error
    from xinda.device import check_device, set_threads
    from xinda.serve.app import run_server

    try:
        settings = ServeSettings(
            host=host, port=port, api_key=api_key or None, cors_origins=tuple(cors_origin or ()),
            max_batch_requests=1 if no_batching else max_batch_requests,
            batch_tokens=batch_tokens, max_wait_ms=max_wait_ms, queue_size=queue_size,
            timeout_s=timeout, max_texts=max_texts, max_chars=max_chars,
            max_body_bytes=max_body_bytes, max_work=max_work, max_attention=max_attention)
    except ValidationError as err:
        raise XindaError(format_validation_error(err, "xinda serve")) from None
    set_threads(threads)
    check_device(device)
    run_server(model_dirs, settings, device, precision, int8_scale)
