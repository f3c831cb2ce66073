"""The app: ``create_app(models, settings)`` builds the FastAPI app (no socket: tests use it
directly), ``run_server`` serves model directories with uvicorn.

Endpoints: POST /v1/translate, /v1/couplet, /v1/poem; GET /v1/models, /health, /metrics,
/docs, and the web page at / (``static/``). Requests become jobs for the model's worker
(``worker.py``); every refusal is a JSON error (``errors.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import socket
import unicodedata
from collections.abc import Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request, Security
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.routing import Route

from xinda import __version__
from xinda.apps.generate import (
    PoemPrompt,
    check_output_fits,
    check_source_fits,
    first_line_characters,
    is_first_line,
    read_prompt,
)
from xinda.apps.rules import CharacterTable
from xinda.decode.options import BEAM_ONLY, SAMPLING_ONLY
from xinda.errors import XindaError
from xinda.serve import tasks
from xinda.serve.auth import API_KEY, BEARER, check_api_key
from xinda.serve.errors import ApiError, install_error_handlers
from xinda.serve.json_body import UniqueKeysRoute
from xinda.serve.metrics import Metrics
from xinda.serve.middleware import CLIENT_GONE, JsonCORS, RequestGuard
from xinda.serve.models import ServedModel, load_models
from xinda.serve.schemas import (
    Constraints,
    CoupletRequest,
    CoupletResponse,
    ErrorResponse,
    Health,
    ModelsResponse,
    PoemRequest,
    PoemResponse,
    TranslateRequest,
    TranslateResponse,
)
from xinda.serve.settings import LOOPBACK, ServeSettings
from xinda.serve.worker import Job, Worker
from xinda.utils import visible_text

log = logging.getLogger("xinda")
STATIC = Path(__file__).with_name("static")
POSTS = frozenset({"/v1/translate", "/v1/couplet", "/v1/poem"})  # JSON bodies, checked
ENDPOINTS = {"/", "/health", "/metrics", "/docs", "/openapi.json", "/v1/models", *POSTS}
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 415, 422, 429, 504)}


class Service:
    """What the endpoints share: the models, their workers and the settings."""

    def __init__(self, models: Mapping[str, ServedModel], settings: ServeSettings,
                 metrics: Metrics):
        self.models, self.settings, self.metrics = dict(models), settings, metrics
        self.workers = {name: Worker(m, settings, metrics) for name, m in self.models.items()}

    async def authorize(self, request: Request,
                        _key: Annotated[object, Security(API_KEY)] = None,
                        _bearer: Annotated[object, Security(BEARER)] = None) -> None:
        """With an API key set: the request must give it (``auth.check_api_key``)."""
        check_api_key(request, self.settings.api_key)

    def model(self, name: str | None, task: str | None = None) -> ServedModel:
        """The served model called ``name`` (the only one when None), of ``task`` if given."""
        if name is None:
            if len(self.models) != 1:
                raise ApiError(422, "invalid_request", "model: required when several models "
                               f"are served ({', '.join(self.models)})")
            name = next(iter(self.models))
        if name not in self.models:
            raise ApiError(404, "unknown_model", f"unknown model {name!r}; served: "
                           f"{', '.join(self.models)}")
        model = self.models[name]
        if task is not None and model.task != task:
            raise ApiError(422, "wrong_task", f"model {name!r} is a {model.task} model, not a "
                           f"{task} model")
        return model

    def texts(self, text: str | list[str], field: str = "text",
              empty_ok: bool = False) -> list[str]:
        """The request's texts, within the limits on their number and length; an empty one is
        refused unless ``empty_ok``."""
        texts = [text] if isinstance(text, str) else text
        limits = self.settings
        if not texts:
            raise ApiError(422, "invalid_request", f"{field}: give at least one text")
        if len(texts) > limits.max_texts:
            raise ApiError(422, "too_many_texts", f"{field}: {len(texts)} texts, at most "
                           f"{limits.max_texts} per request")
        for i, line in enumerate(texts):
            if not empty_ok and not visible_text(line):
                raise ApiError(422, "invalid_request", f"{field}[{i}]: empty text (or control "
                               "and invisible characters only); send only lines with something "
                               "to translate")
            chars = len(line) if len(line) > limits.max_chars else normalized_length(line)
            if chars > limits.max_chars:
                grown = " after NFKC normalisation" * (chars > len(line))
                raise ApiError(422, "text_too_long", f"{field}[{i}]: {chars} characters{grown}, "
                               f"at most {limits.max_chars}")
        return texts

    def check_work(self, model: ServedModel, kind: str, options: dict,
                   inputs: Sequence[Any]) -> None:
        """Refuse a job that may take more decoder row-steps than ``max_work``, or whose
        response may carry more attention weights than ``max_attention``."""
        attention = 0
        if kind == "translate":  # one pass over the lines for both measures
            amount, attention = tasks.translate_measures(model.translator, options, inputs)
        else:
            amount = tasks.work(model.translator, kind, options, inputs)
        limit = self.settings.max_work
        if amount > limit:
            raise ApiError(422, "too_much_work", f"the request may take {amount:,} decoder "
                           f"steps (texts x beam or samples x output length limit), over the "
                           f"limit of {limit:,}: send fewer or shorter texts, or lower beam, "
                           "samples, n_best or exact_length")
        if attention > (limit := self.settings.max_attention):
            raise ApiError(422, "too_much_work", f"the response may carry {attention:,} "
                           "attention weights (outputs x output length limit x source "
                           f"tokens), over the limit of {limit:,}: ask for attention with "
                           "fewer or shorter texts, or lower n_best, samples or exact_length")

    def check_prefixes(self, model: ServedModel, prefixes: Sequence[str | None]) -> None:
        """Refuse a prefix the model cannot write before the job is queued: in the worker its
        error would fail a batch of other requests too, and name the batch's line."""
        for i, prefix in enumerate(prefixes):
            if prefix:
                model.translator.prefix_ids(f"constraints.prefix[{i}]", prefix, False)

    def check_fits(self, model: ServedModel, sources: Sequence[str], lengths: Sequence[int],
                   what: str, output: str, fixed: str = "") -> None:
        """Refuse a source the model cannot read whole or an output of ``lengths[i]``
        characters (``fixed`` among them) it cannot write (``check_source_fits``,
        ``check_output_fits``). ``what``, ``output``: how an error names source i, output i."""
        try:
            for i, (source, length) in enumerate(zip(sources, lengths, strict=True)):
                check_source_fits(model.translator, source, what.format(i=i))
                check_output_fits(model.translator, length, output.format(i=i), fixed)
        except XindaError as err:
            raise ApiError(422, "text_too_long", str(err)) from None

    async def run(self, request: Request, model: ServedModel, kind: str, options: dict,
                  inputs: Sequence[Any], alone: bool = False) -> list:
        """Queue a job for ``model``'s worker and wait for its results (one per input); with
        ``alone`` the job is batched with no other request. The job is abandoned when the
        request times out or its client disconnects."""
        # measuring tokenises every text (Moses, jieba): not on the event loop
        await asyncio.to_thread(self.check_work, model, kind, options, inputs)
        key = (kind, json.dumps(options, sort_keys=True)) + ((object(),) if alone else ())
        job = Job(kind, key, options, list(inputs), alone=alone)
        try:
            self.workers[model.name].submit(job)
        except queue.Full:
            raise ApiError(429, "queue_full", f"model {model.name!r} is busy: retry later",
                           {"Retry-After": str(self.settings.retry_after_s)}) from None
        try:
            return await asyncio.wait_for(results(job, request), self.settings.timeout_s)
        except asyncio.TimeoutError:  # the job was abandoned
            raise ApiError(504, "timeout", f"no result within {self.settings.timeout_s:g} s"
                           ) from None
        except (XindaError, ApiError):
            raise
        except Exception as err:  # noqa: BLE001 - a job's failure is its request's error
            log.error("xinda serve: %s job failed: %r", kind, err)
            raise ApiError(500, "internal", f"decoding failed: {type(err).__name__}") from None


async def results(job: Job, request: Request) -> list:
    """The job's results, or a 499 "client_gone" once the request's client disconnects first.
    The job is abandoned when its results are not awaited to the end (a disconnect, or the
    timeout's cancellation): nobody reads its answer."""
    answer = asyncio.wrap_future(job.future)
    gone = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # also on the timeout's cancellation
        gone.cancel()
        if not answer.done():
            answer.cancel()  # its outcome, if it comes, is dropped
            job.abandon()  # no longer waiting: skipped, or its decoding stopped
    if not answer.cancelled():
        return answer.result()
    raise ApiError(CLIENT_GONE, "client_gone", "the client disconnected before its answer")


def normalized_length(text: str) -> int:
    """Characters of ``text``, or of its NFKC form if more: what a text pipeline may tokenise
    (NFKC writes one character as up to 18: U+FDFA)."""
    return max(len(text), len(unicodedata.normalize("NFKC", text)))


async def disconnected(request: Request) -> None:
    """Return once the request's client has disconnected (its body was read before)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def decode_options(model: ServedModel, req: TranslateRequest) -> tuple[dict, bool]:
    """The request's decode settings (checked against the model's) and whether it samples."""
    options = req.decode_options()
    dec = model.translator.decode_settings(options)
    if not dec.sampling and any(name in options for name in SAMPLING_ONLY):
        raise ApiError(422, "invalid_request", f"{', '.join(SAMPLING_ONLY)}: need "
                       "\"sampling\": true")
    if dec.sampling and (beam := [{"nbest": "n_best"}.get(k, k) for k in BEAM_ONLY
                                  if k in options]):
        raise ApiError(422, "invalid_request", f"{', '.join(beam)}: beam-search settings, not "
                       "used when sampling (samples sets the outputs per text)")
    return options, dec.sampling


def routes(svc: Service) -> APIRouter:
    """The API's endpoints, which need the API key when one is set (the POSTs' is checked
    before their bodies are read, by ``RequestGuard``); /health and the page are open."""
    api = APIRouter(dependencies=[Depends(svc.authorize)], responses=ERRORS,
                    route_class=UniqueKeysRoute)  # duplicate JSON keys refused

    @api.post("/v1/translate", response_model=TranslateResponse)
    async def translate(req: TranslateRequest, request: Request) -> JSONResponse:
        """Translate one text or a list; decoding controls and constraints are xinda's."""
        model, texts = svc.model(req.model), svc.texts(req.text)
        constraints = req.constraints or Constraints()
        prefixes = [None] * len(texts) if constraints.prefix is None else constraints.prefix
        if len(prefixes) != len(texts):
            raise ApiError(422, "invalid_request", f"constraints.prefix: {len(prefixes)} "
                           f"prefixes for {len(texts)} texts")
        svc.texts(constraints.prefix or [""], "constraints.prefix", empty_ok=True)
        await asyncio.to_thread(svc.check_prefixes, model, prefixes)  # tokenises: off the loop
        decode, sampling = decode_options(model, req)
        options = {"decode": decode, "attention": req.attention,
                   "constraints": constraints.model_dump(exclude={"prefix"})}
        outputs = await svc.run(request, model, "translate", options,
                                list(zip(texts, prefixes)),
                                alone=sampling)  # a seed's samples depend on the batch

        def response() -> JSONResponse:  # attention weights make large bodies: off the loop
            return JSONResponse({"model": model.name, "translations": [
                tasks.translation_json(text, nbest, req.attention)
                for text, nbest in zip(texts, outputs)]})

        return await asyncio.to_thread(response)

    @api.post("/v1/couplet", response_model=CoupletResponse)
    async def couplet(req: CoupletRequest, request: Request) -> JSONResponse:
        """Second lines (下联) for first lines (上联), with a couplet model."""
        model, texts = svc.model(req.model, "couplet"), svc.texts(req.text)
        for i, text in enumerate(texts):  # what write_couplets takes for the first line
            if not is_first_line(text):
                raise ApiError(422, "invalid_request", f"text[{i}]: empty (or invisible "
                               "characters or punctuation only): a couplet needs a first line")
        firsts = [first_line_characters(text) for text in texts]  # what write_couplets reads
        await asyncio.to_thread(svc.check_fits, model, firsts, [len(f) for f in firsts],
                                "text[{i}]: a first line", "text[{i}]")
        options = {"nbest": req.n_best, "no_copy": req.no_copy, "tone": req.tone}
        outputs = await svc.run(request, model, "couplet", given(options), texts)
        return JSONResponse({"model": model.name, "couplets": [
            tasks.couplet_json(text, lines) for text, lines in zip(texts, outputs)]})

    @api.post("/v1/poem", response_model=PoemResponse)
    async def poem(req: PoemRequest, request: Request) -> JSONResponse:
        """A quatrain from keywords (or one line per acrostic character), with a poetry
        model."""
        model = svc.model(req.model, "poetry")
        prompt = PoemPrompt(req.keyword_list(), req.form, req.acrostic)
        sent = req.keywords if isinstance(req.keywords, list) else [req.keywords]
        svc.texts(sent or [""], "keywords", empty_ok=True)  # lengths, by the indices sent
        svc.texts(list(prompt.keywords) or [""], "keywords", empty_ok=True)  # words' count
        table = await asyncio.to_thread(CharacterTable.of, model.translator.tgt_vocab)
        prompt = await asyncio.to_thread(  # here, not failing a batch of others; OpenCC
            read_prompt, prompt, table, "poem", req.rhyme)  # converts: off the loop
        await asyncio.to_thread(svc.check_fits, model, [prompt.source()], [prompt.length()],
                                "keywords: the source (form word and keywords)", "poem",
                                prompt.fixed())
        options = given({"nbest": req.n_best, "rhyme": req.rhyme})
        [outputs] = await svc.run(request, model, "poem", options, [prompt])
        poems, error = tasks.poem_json(outputs)
        return JSONResponse({"model": model.name, "poems": poems, "error": error})

    @api.get("/v1/models", response_model=ModelsResponse)
    async def models() -> dict:
        """The served models: name, task, architecture and languages."""
        return {"models": [m.info() for m in svc.models.values()]}

    @api.get("/metrics", response_class=Response)
    async def metrics() -> Response:
        """Prometheus metrics."""
        return Response(svc.metrics.render(), media_type=svc.metrics.content_type)

    for path, endpoint in (("/v1/models", models), ("/metrics", metrics)):  # HEAD where GET is
        api.add_api_route(path, endpoint, methods=["HEAD"], include_in_schema=False)
    return api


def given(options: dict) -> dict:
    """``options`` without the ones left unset (the library's defaults apply)."""
    return {k: v for k, v in options.items() if v is not None}


def create_app(models: Mapping[str, ServedModel], settings: ServeSettings | None = None
               ) -> FastAPI:
    """The app serving ``models`` (name -> model); the workers run while the app's lifespan
    does (``with TestClient(app)``, or uvicorn)."""
    settings = settings or ServeSettings()
    svc = Service(models, settings, Metrics(ENDPOINTS))

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        for worker in svc.workers.values():
            worker.start()
        yield
        for worker in svc.workers.values():
            worker.stop()

    app = FastAPI(title="xinda", version=__version__, lifespan=lifespan,
                  redirect_slashes=False,  # (a 307 to the same path + "/" before any check)
                  description="Translation, couplets and poems with trained xinda models, "
                  "batched across requests.")
    app.state.service = svc
    install_error_handlers(app)

    @app.get("/health", response_model=Health)
    async def health() -> dict:
        return {"status": "ok", "models": list(svc.models)}
    # load balancers' probes (not in the schema: one operation per path and method there)
    app.add_api_route("/health", health, methods=["HEAD"], include_in_schema=False)

    app.include_router(routes(svc))
    app.add_middleware(RequestGuard, metrics=svc.metrics, max_body_bytes=settings.max_body_bytes,
                       body_paths=POSTS, api_key=settings.api_key,
                       hosts=None if settings.api_key else frozenset((*LOOPBACK, "")))
    if settings.cors_origins:  # added last = outermost: the guard's refusals get CORS too
        app.add_middleware(JsonCORS, metrics=svc.metrics,
                           allow_origins=list(settings.cors_origins),
                           allow_methods=["GET", "POST"],
                           allow_headers=["Content-Type", "Authorization", "X-API-Key"])
    add_page(app)
    return app


def add_page(app: FastAPI) -> None:
    """The web page's files, each a GET route of its own: a catch-all mount at / would answer
    a wrong method on an API path (GET /v1/translate) with its 404 instead of the API's 405."""
    files = StaticFiles(directory=STATIC, html=True)
    for path in sorted(STATIC.iterdir()):
        route = "/" if path.name == "index.html" else f"/{path.name}"
        app.router.routes.append(Route(route, files, methods=["GET"], include_in_schema=False))


def run_server(model_dirs: Sequence[Path], settings: ServeSettings, device: str = "cpu",
               precision: str | None = None, int8_scale: str | None = None) -> None:
    """Serve ``model_dirs`` until SIGTERM/SIGINT; requests in flight then finish."""
    import uvicorn

    if not settings.loopback and not settings.api_key:
        raise XindaError(f"serving on {settings.host} needs --api-key (or XINDA_API_KEY); "
                         f"without one only {', '.join(LOOPBACK)} are allowed")
    check_address(settings.host, settings.port)
    app = create_app(load_models(model_dirs, device, precision, int8_scale), settings)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="info",
                timeout_graceful_shutdown=int(settings.timeout_s) + 5)


def check_address(host: str, port: int) -> None:
    """Fail in one line, before the models load, where the server could not listen (uvicorn
    would log its error and exit with 3)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)
    except socket.gaierror as err:  # create_server would say "Unknown error -2"
        hint = " (write an IPv6 address without brackets)" if host.startswith("[") else ""
        raise XindaError(f"{host}: cannot resolve the host name: {err.strerror}{hint}") from None
    try:
        with socket.create_server((host, port), family=family):
            pass
    except OSError as err:
        reason = os.strerror(err.errno) if err.errno else str(err)
        raise XindaError(f"{host}:{port}: cannot listen: {reason}") from None
