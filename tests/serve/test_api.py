"""The REST API through FastAPI's TestClient (no socket): every endpoint of the contract with
the tiny models of conftest.py, and the refusals of bad requests, each a JSON error with a 4xx
status, after which the worker still serves."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from xinda.apps.generate import PoemPrompt
from xinda.decode.translator import Translator
from xinda.errors import XindaError
from xinda.serve.app import check_address, create_app
from xinda.serve.models import load_models
from xinda.serve.settings import ServeSettings

NUMBERS = "three thousand seven hundred"


def post(client, path: str, **body):
    return client.post(path, json=body)


def assert_error(response, status: int, code: str, *fragments: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    assert "\n" not in error["message"]
    for fragment in fragments:
        assert fragment in error["message"], error
    return error["message"]


def test_health_and_models(client):
    for path in ("/health", "/v1/models", "/metrics"):  # probes (before: 405; found by review)
        head = client.head(path)
        assert head.status_code == 200 and head.content == b"", path
    assert client.get("/health").json() == {"status": "ok",
                                            "models": ["numbers", "couplet", "poetry"]}
    models = {m["name"]: m for m in client.get("/v1/models").json()["models"]}
    assert models["numbers"] == {"name": "numbers", "task": "translate", "arch": "transformer",
                                 "src_lang": "words", "tgt_lang": "digits",
                                 "precision": "fp32", "int8_scale": None, "sampling": False}
    assert models["couplet"]["task"] == "couplet" and models["poetry"]["task"] == "poetry"


def test_translate_one_text_and_a_list(client):
    one = post(client, "/v1/translate", model="numbers", text=NUMBERS).json()
    assert one["model"] == "numbers" and len(one["translations"]) == 1
    entry = one["translations"][0]
    assert entry["source"] == NUMBERS and entry["error"] is None
    assert entry["truncated_from"] is None
    [best] = entry["nbest"]
    assert isinstance(best["text"], str) and isinstance(best["score"], float)
    assert best["source_pieces"] and "attention" not in best
    many = post(client, "/v1/translate", model="numbers", text=["one", NUMBERS]).json()
    assert [t["source"] for t in many["translations"]] == ["one", NUMBERS]
    # batched with others or alone: the same output, the score up to float rounding
    batched = many["translations"][1]
    assert batched["nbest"][0].pop("score") == pytest.approx(entry["nbest"][0].pop("score"),
                                                             abs=1e-5)
    assert batched == entry


@pytest.mark.parametrize("text", ["", " \t", ["one", ""], "\u0001\u0002", ["one", "\x7f"],
                                  "\ufeff\u200b", ["one", "\u200e \u2060"]])
def test_an_empty_text_is_a_bad_request_naming_it(client, text):
    response = post(client, "/v1/translate", model="numbers", text=text)
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and "empty text" in error["message"]
    assert error["message"].startswith("text[1]" if isinstance(text, list) else "text[0]")


def test_n_best_and_attention_shape(client):
    entry = post(client, "/v1/translate", model="numbers", text=NUMBERS, beam=3, n_best=3,
                 alpha=0.5, stop="best", attention=True).json()["translations"][0]
    assert len(entry["nbest"]) == 3
    scores = [h["score"] for h in entry["nbest"]]
    assert scores == sorted(scores, reverse=True)
    for hyp in entry["nbest"]:
        rows = hyp["attention"]
        assert len(rows) == len(hyp["target_pieces"]) + 1
        assert {len(row) for row in rows} == {len(hyp["source_pieces"]) + 1}
        assert all(sum(row) == pytest.approx(1, abs=1e-2) for row in rows)


@pytest.mark.parametrize("step", ["translation_json", "translate_measures"])
def test_the_translate_request_is_measured_and_answered_off_the_event_loop(client, monkeypatch,
                                                                           step):
    """Measuring a request tokenises its texts (Moses, jieba), and attention weights make
    bodies of megabytes: either on the event loop would hold up every other request (found
    by review)."""
    import asyncio

    from xinda.serve import tasks

    loops = []

    def recording(*args):
        try:
            loops.append(asyncio.get_running_loop())
        except RuntimeError:
            loops.append(None)
        return original(*args)

    original = getattr(tasks, step)
    monkeypatch.setattr(tasks, step, recording)
    response = post(client, "/v1/translate", model="numbers", text=[NUMBERS, NUMBERS],
                    attention=True)
    assert response.status_code == 200 and len(response.json()["translations"]) == 2
    assert loops and set(loops) == {None}


def test_sampling_is_reproducible_with_a_seed(client):
    body = {"model": "numbers", "text": NUMBERS, "sampling": True, "samples": 3, "seed": 7,
            "temperature": 1.5, "top_k": 5, "top_p": 0.9}
    first, second = (client.post("/v1/translate", json=body).json() for _ in range(2))
    assert len(first["translations"][0]["nbest"]) == 3 and first == second


@pytest.mark.parametrize("temperature", [1e-300, 1e-45])
def test_a_tiny_temperature_is_greedy(client, temperature):
    greedy = post(client, "/v1/translate", model="numbers", text=NUMBERS, beam=1).json()
    response = post(client, "/v1/translate", model="numbers", text=NUMBERS, sampling=True,
                    temperature=temperature, samples=2)
    assert response.status_code == 200, response.text
    texts = [h["text"] for h in response.json()["translations"][0]["nbest"]]
    assert texts == [greedy["translations"][0]["nbest"][0]["text"]] * 2


@pytest.mark.parametrize("options", [{"alpha": 2.5}, {"beam": 3, "stop": "best"},
                                     {"sampling": True, "top_k": 3, "seed": 1},
                                     {"sampling": True, "top_p": 0.5, "seed": 1}])
def test_each_decode_setting_reaches_the_translator(client, monkeypatch, options):
    """Guards the request -> DecodeConfig mapping: a setting dropped from
    ``TranslateRequest.decode_options`` would decode with the model's own value, silently."""
    real, calls = Translator.translate, []

    def translate(self, lines, **kwargs):
        calls.append(kwargs)
        return real(self, lines, **kwargs)

    monkeypatch.setattr(Translator, "translate", translate)
    response = post(client, "/v1/translate", model="numbers", text=NUMBERS, **options)
    assert response.status_code == 200, response.text
    [kwargs] = calls
    assert {name: kwargs.get(name) for name in options} == options


def test_alpha_is_the_translators_length_penalty(client, served_models):
    """The response's best hypothesis is ``Translator.translate``'s with the same alpha, whose
    score (log P / ((5 + |y|) / 6)^alpha) is not the default alpha's."""
    translator = served_models["numbers"].translator

    def best(alpha: float) -> tuple[str, float]:
        entry = post(client, "/v1/translate", model="numbers", text=NUMBERS,
                     alpha=alpha).json()["translations"][0]["nbest"][0]
        [[own, *_]] = translator.translate([NUMBERS], alpha=alpha)
        assert entry["text"] == own.text
        assert entry["score"] == pytest.approx(own.score, abs=1e-5)
        return entry["text"], entry["score"]

    default = translator.cfg.decode.alpha
    _, score = best(default + 2.0)
    assert score != pytest.approx(best(default)[1], abs=1e-3)


@pytest.mark.parametrize("nucleus", [{"top_k": 1}, {"top_p": 1e-6}])
def test_a_one_token_nucleus_samples_greedily_even_when_hot(client, nucleus):
    """top_k 1, or a top_p below any token's probability, keeps only the most probable token:
    every sample is the greedy output, even at temperature 100 (where, without them, the
    samples of this seed differ from it)."""
    greedy = post(client, "/v1/translate", model="numbers", text=NUMBERS,
                  beam=1).json()["translations"][0]["nbest"][0]["text"]

    def samples(**options) -> list[str]:
        response = post(client, "/v1/translate", model="numbers", text=NUMBERS, sampling=True,
                        temperature=100.0, samples=4, seed=3, **options)
        assert response.status_code == 200, response.text
        return [h["text"] for h in response.json()["translations"][0]["nbest"]]

    assert samples(**nucleus) == [greedy] * 4
    assert samples() != [greedy] * 4


def test_constraints(client):
    def best(**constraints):
        response = post(client, "/v1/translate", model="numbers", text=["one", "two"],
                        constraints=constraints)
        assert response.status_code == 200, response.text
        return [t["nbest"][0] for t in response.json()["translations"]]
    assert all(len(h["target_pieces"]) == 3 for h in best(exact_length=3))
    assert all(h["text"].startswith("1") for h in best(prefix=["1", "1"], exact_length=4))
    assert all("e" not in h["target_pieces"] for h in best(ban=["e"], no_repeat_ngram=2,
                                                           ban_source_copy=True))


def test_a_prefix_the_model_cannot_write_is_named_by_its_index(client):
    """Before: checked in the worker, it was named "prefix 2" (1-based, and counted over the
    batch, which may hold other requests' lines; found by review)."""
    response = post(client, "/v1/translate", model="numbers", text=["one", "two"],
                    constraints={"prefix": ["", "x y"]})
    message = assert_error(response, 422, "invalid_request", "not in the target vocabulary")
    assert message.startswith("constraints.prefix[1]: ")
    assert post(client, "/v1/translate", model="numbers", text="one").status_code == 200


def test_couplet(client):
    body = post(client, "/v1/couplet", model="couplet", text=["春风江月，花鸟", "山水"], n_best=2,
                tone=True, no_copy=True).json()
    first, second = body["couplets"]
    assert first["source"] == "春风江月，花鸟" and first["error"] is None
    assert len(first["nbest"]) == 2
    assert all(len(h["text"]) == 7 and h["text"][4] == "，" for h in first["nbest"])
    assert all(len(h["text"]) == 2 for h in second["nbest"])


def test_a_couplet_first_line_longer_than_the_model_reads_is_refused(client, served_models):
    """Before: its source was cut to the limit and its second line, as long as the whole
    first line, written from a part of it (found by review)."""
    translator = served_models["couplet"].translator
    limit = translator.source_limit(translator.cfg.decode)
    line = ("春风江月，" * limit)[:limit + 1]
    response = post(client, "/v1/couplet", model="couplet", text=["春风", line])
    assert_error(response, 422, "text_too_long", "text[1]", f"at most {limit}",
                 "decode.max_input_len")
    assert post(client, "/v1/couplet", model="couplet", text="春风").status_code == 200


def test_poem_keywords_longer_than_the_model_reads_are_refused(client, served_models):
    """Before: the source was cut to the limit and the poem written without the last
    keywords, with nothing in the response saying so."""
    translator = served_models["poetry"].translator
    limit = translator.source_limit(translator.cfg.decode)

    def size(keyword: str) -> int:
        return len(translator.source_ids(PoemPrompt((keyword,)).source(), False))
    longest = max(n for n in range(1, limit + 1) if size("春" * n) <= limit)
    body = {"model": "poetry", "keywords": ["江月", "春" * longest], "form": 5}
    assert post(client, "/v1/poem", **{**body, "keywords": body["keywords"][1:]}
                ).status_code == 200
    assert_error(post(client, "/v1/poem", **body), 422, "text_too_long", "keywords",
                 f"at most {limit}")


def test_a_poem_of_two_piece_acrostic_characters_is_measured_before_queueing(
        client, served_models, monkeypatch):
    """16 lines of 8 fit a 129-token table, not with "▁" + "春" opening each line: refused
    as text_too_long before the job is queued (before: the worker's search failed)."""
    from dataclasses import replace

    from xinda.apps.rules import CharacterTable

    translator = served_models["poetry"].translator
    real = CharacterTable.of(translator.tgt_vocab)
    one = {ch: i for ch, i in real.one.items() if ch != "春"}
    table = replace(real, one=one, by_one={i: ch for ch, i in one.items()})
    monkeypatch.setattr(CharacterTable, "of", lambda vocab: table)
    monkeypatch.setattr(translator.model.cfg, "max_positions", 130)
    body = {"model": "poetry", "keywords": ["江月"], "acrostic": "春" * 16, "form": 7,
            "rhyme": False}
    assert_error(post(client, "/v1/poem", **body), 422, "text_too_long",
                 "poem: the output takes at least 144 tokens")


def test_poem_with_keywords_and_acrostic(client):
    body = post(client, "/v1/poem", model="poetry", keywords="春风 江月", form=5).json()
    [poem] = body["poems"]
    assert body["error"] is None and len(poem["lines"]) == 4
    assert all(len(line) == 5 for line in poem["lines"])
    body = post(client, "/v1/poem", model="poetry", keywords=["春风"], acrostic="春夏秋",
                form=7, rhyme=False, n_best=2).json()
    assert len(body["poems"]) == 2
    for poem in body["poems"]:
        assert [line[0] for line in poem["lines"]] == list("春夏秋")
        assert all(len(line) == 7 for line in poem["lines"])


def test_poem_keywords_split_at_chinese_commas():
    """Before: "春风，江月" was one keyword (only spaces and ASCII commas split)."""
    from xinda.serve.schemas import PoemRequest

    assert PoemRequest(keywords="春风，江月").keyword_list() == ("春风", "江月")


def test_the_only_model_needs_no_name(make_client):
    with make_client(("numbers",)) as client:
        assert post(client, "/v1/translate", text="one").json()["model"] == "numbers"


BAD_JSON = [
    (b"{bad", 400, "bad_json"),
    (b'{"text": "one",}', 400, "bad_json"),
    (b"\xff\xfe{}", 400, "bad_encoding"),
    (b'{"text": "caf\xe9"}', 400, "bad_encoding"),
    (b'{"model": "numbers", "text": "\\ud800"}', 400, "bad_encoding"),
    # before: 422s, "model: Input should be a valid string" and, for a key, "the request body
    # must be a JSON object" (validation refused some fields' surrogates, not others')
    (b'{"model": "\\ud800", "text": "one"}', 400, "bad_encoding"),
    (b'{"text": "one", "constraints": {"\\udc00": 1}}', 400, "bad_encoding"),
    (b'{"\\ud800": 1}', 400, "bad_encoding"),
    # before: 200, BOM-less UTF-16 and UTF-32 of ASCII are valid UTF-8 (with NULs), and
    # json.loads read them as what they are (found by review)
    ('{"model": "numbers", "text": "one"}'.encode("utf-16-le"), 400, "bad_encoding"),
    ('{"model": "numbers", "text": "one"}'.encode("utf-32-be"), 400, "bad_encoding"),
    (b"", 422, "invalid_request"),
    (b"[]", 422, "invalid_request"),
    (b'"text"', 422, "invalid_request"),
]


@pytest.mark.parametrize(("body", "status", "code"), BAD_JSON,
                         ids=lambda v: ascii(v)[:40] if isinstance(v, bytes) else None)
def test_malformed_bodies(client, body, status, code):
    response = client.post("/v1/translate", content=body,
                           headers={"content-type": "application/json"})
    assert_error(response, status, code)
    assert post(client, "/v1/translate", model="numbers", text="one").status_code == 200


@pytest.mark.parametrize(("path", "body", "key"), [
    ("/v1/translate", b'{"text": "the cat", "text": "dog"}', "'text'"),
    ("/v1/translate", b'{"text": "one", "constraints": {"ban": [], "ban": ["1"]}}', "'ban'"),
    ("/v1/translate", b'{"text": ["one"], "beam": 2, "beam": 1}', "'beam'"),
    ("/v1/couplet", b'{"text": "x", "model": "couplet", "model": "numbers"}', "'model'"),
])
def test_a_duplicate_key_is_refused_by_name(client, path, body, key):
    """Before: the last of the duplicates silently won ("dog" translated, 200)."""
    response = client.post(path, content=body, headers={"content-type": "application/json"})
    assert_error(response, 400, "bad_json", f"duplicate key {key}")
    assert post(client, "/v1/translate", model="numbers", text="one").status_code == 200


@pytest.mark.parametrize("body", [b"[" * 100_000 + b"]" * 100_000,
                                  b'{"text": "one", "beam": ' + b"1" * 5000 + b"}"],
                         ids=["nested-too-deeply", "over-4300-digits"])
def test_unparsable_bodies_are_bad_json(client, body):
    response = client.post("/v1/translate", content=body,
                           headers={"content-type": "application/json"})
    assert_error(response, 400, "bad_json", "could not be parsed")
    assert post(client, "/v1/translate", model="numbers", text="one").status_code == 200


BAD_FIELDS = [
    ({"text": 5}, "text"),
    ({"text": ["one", 2]}, "text[1]"),
    ({"text": "one", "beam": "5"}, "beam"),
    ({"text": "one", "beam": 0}, "beam"),
    ({"text": "one", "beam": 1000}, "beam"),
    ({"text": "one", "n_best": 2.5}, "n_best"),
    ({"text": "one", "attention": "yes"}, "attention"),
    ({"text": "one", "top_p": 2}, "top_p"),
    ({"text": "one", "stop": "first"}, "stop"),
    ({"text": "one", "constraints": {"exact_length": -1}}, "constraints.exact_length"),
    ({"text": "one", "constraints": {"prefix": "1"}}, "constraints.prefix"),
    ({"text": "one", "constraints": {"prefix": ["1", "2"]}}, "constraints.prefix"),
    ({"text": "one", "constraints": {"prefix": []}}, "constraints.prefix"),  # before: ignored
    ({"text": "one", "constraints": {"ban": ["five hundred"]}}, "five hundred"),
    ({"text": "one", "constraints": {"ban": ["</s>"]}}, "control token"),  # before: no output
    ({"text": "one", "beems": 2}, "beems"),
    ({"text": "one", "temperature": 0.5}, "sampling"),
    ({"text": "one", "sampling": True, "n_best": 2}, "n_best"),  # before: silently one output
    ({"text": []}, "text"),
    ({}, "text"),
    ({"text": "one", "model": None, "checkpoint": "/etc/passwd"}, "checkpoint"),
]
UNKNOWN_KEYS = [
    ({"text": "one", "beems": 2}, "unknown field 'beems'"),
    ({"text": "one", "str": 1}, "unknown field 'str'"),
    ({"text": "one", "": 1}, "unknown field ''"),
    ({"text": "one", "beam[0]": 2}, "unknown field 'beam[0]'"),
    ({"text": "one", "constraints": {"list": 1}}, "constraints: unknown field 'list'"),
]


@pytest.mark.parametrize(("body", "field"), BAD_FIELDS)
def test_wrong_types_and_values_name_the_field(make_client, body, field):
    with make_client(("numbers",)) as client:
        assert_error(client.post("/v1/translate", json=body), 422, "invalid_request", field)
        assert post(client, "/v1/translate", model="numbers", text="one").status_code == 200


@pytest.mark.parametrize(("body", "message"), UNKNOWN_KEYS)
def test_unknown_keys_are_named_as_sent(make_client, body, message):
    with make_client(("numbers",)) as client:
        assert assert_error(client.post("/v1/translate", json=body), 422,
                            "invalid_request") == message


@pytest.mark.parametrize("content_type", [None, "application/x-www-form-urlencoded",
                                          "text/plain", "application/jsonx"])
def test_a_body_not_sent_as_json_is_415(client, content_type):
    headers = {"content-type": content_type} if content_type else {}
    response = client.post("/v1/translate", content=b'{"text": "one"}', headers=headers)
    assert_error(response, 415, "unsupported_media_type", "Content-Type: application/json")
    for json_type in ("application/json; charset=utf-8", "Application/JSON",
                      "application/vnd.xinda+json"):
        response = client.post("/v1/translate", content=b'{"text": "one", "model": "numbers"}',
                               headers={"content-type": json_type})
        assert response.status_code == 200, response.text


@pytest.mark.parametrize("name", ["nope", "../numbers", "/tmp/numbers", "numbers/config.yaml",
                                  "x" * 200])
def test_unknown_models_and_paths(client, name):
    assert_error(post(client, "/v1/translate", model=name, text="one"), 404, "unknown_model")


def test_wrong_task_and_bad_prompts(client):
    assert_error(post(client, "/v1/couplet", model="numbers", text="春风"), 422, "wrong_task")
    assert_error(post(client, "/v1/poem", model="couplet", keywords="春风"), 422, "wrong_task")
    assert_error(post(client, "/v1/couplet", model="couplet", text=["山水", " "]), 422,
                 "invalid_request", "text[1]")
    assert_error(post(client, "/v1/poem", model="poetry"), 422, "invalid_request", "keywords")
    # before: a ZWJ first line passed here and failed its whole batch in the worker; invisible
    # keywords wrote a poem about nothing
    assert_error(post(client, "/v1/couplet", model="couplet", text=["山水", "\u200d"]), 422,
                 "invalid_request", "text[1]", "invisible")
    assert_error(post(client, "/v1/couplet", model="couplet", text=["，。"]), 422,
                 "invalid_request", "text[0]", "punctuation only")  # before: answered "，。"
    assert_error(post(client, "/v1/poem", model="poetry", keywords=["\u200b", "\u2060"]), 422,
                 "invalid_request", "keywords")
    assert_error(post(client, "/v1/poem", model="poetry", keywords="春", form=6), 422,
                 "invalid_request", "form")
    assert_error(post(client, "/v1/poem", model="poetry", acrostic="龘"), 422,
                 "invalid_request", "龘")


def test_bad_poem_prompts_are_refused_before_they_are_queued(make_client):
    """The workers are stopped: a request that reached the queue would wait for its timeout.
    Before: an acrostic the model cannot write, or rhyme with fewer than 4 lines, failed in
    the worker, with every other request of its batch (found by review)."""
    with make_client(("poetry",), start=False, timeout_s=1) as client:
        assert_error(post(client, "/v1/poem", acrostic="龘"), 422, "invalid_request",
                     "poem: acrostic character '龘'")
        assert_error(post(client, "/v1/poem", acrostic="春夏", rhyme=True), 422,
                     "invalid_request", "rhyme rule ties line 4 to line 2")


def test_limits_on_texts_characters_and_body(make_client):
    with make_client(max_texts=3, max_chars=20, max_body_bytes=1000) as client:
        assert_error(post(client, "/v1/translate", text=["one"] * 4), 422, "too_many_texts")
        assert_error(post(client, "/v1/translate", text=["one", "x" * 21]), 422,
                     "text_too_long", "text[1]")
        # before: counted before NFKC, which writes U+FDFA as 18 characters: 1000 of them in a
        # line were 18,000 to tokenise, 4 times (found by review)
        assert_error(post(client, "/v1/translate", text=["one", "\ufdfa" * 2]), 422,
                     "text_too_long", "text[1]: 36 characters after NFKC normalisation, at "
                     "most 20")
        assert post(client, "/v1/translate", text="\ufdfa").status_code == 200
        assert_error(post(client, "/v1/translate", text="one", constraints={"prefix": ["1" * 21]}),
                     422, "text_too_long", "constraints.prefix[0]")
        assert_error(client.post("/v1/translate", content=b"x" * 10_000_000), 413, "too_large")
        chunks = (b"x" * 100 for _ in range(100))  # no Content-Length: counted while read
        assert_error(client.post("/v1/translate", content=chunks), 413, "too_large")
        assert post(client, "/v1/translate", model="numbers", text="one").status_code == 200
    with make_client(("poetry",), max_chars=20) as client:  # before: keywords[0], the dropped
        assert_error(post(client, "/v1/poem", keywords=["\u200b", "春" * 21]), 422,
                     "text_too_long", "keywords[1]")


def test_a_list_over_max_items_is_refused_before_its_items_are_checked(make_client):
    """Before: 500,000 wrong-typed texts in a 1 MB body took pydantic seconds on the event
    loop, an error entry per item, before the 422 (found by review)."""
    from pydantic import ValidationError

    from xinda.serve.schemas import MAX_ITEMS, PoemRequest, TranslateRequest

    over = [1] * (MAX_ITEMS + 1)
    for schema, body in ((TranslateRequest, {"text": over}),
                         (TranslateRequest, {"text": "one", "constraints": {"prefix": over}}),
                         (PoemRequest, {"keywords": over})):
        with pytest.raises(ValidationError) as info:
            schema.model_validate(body)
        assert info.value.error_count() <= 2  # the str branch's and the length's
        assert any(e["type"] == "too_long" for e in info.value.errors())
    with make_client(max_body_bytes=10 << 20) as client:
        assert post(client, "/v1/translate", text=over).status_code == 422
        # before: "text: Input should be a valid string", the str branch's error of the union
        # (found by review)
        assert_error(post(client, "/v1/translate", text=["one"] * (MAX_ITEMS + 1)), 422,
                     "invalid_request", f"text: List should have at most {MAX_ITEMS} items")
    with pytest.raises(ValueError, match="max_texts"):
        ServeSettings(max_texts=MAX_ITEMS + 1)


def test_an_unresolvable_host_is_named():
    """Before: "Unknown error -2" (``os.strerror`` of a name-lookup code)."""
    with pytest.raises(XindaError, match=r"^\[::1\]: cannot resolve the host name: .*"
                                         r"\(write an IPv6 address without brackets\)$"):
        check_address("[::1]", 8000)


def test_work_is_limited(make_client):
    """Work: texts x beam (or samples) x output length limit; exact_length 3 sets the limit
    to 3 + EOS. The refusal comes before queueing (the workers are stopped)."""
    body = {"text": ["one", "two"], "beam": 3, "constraints": {"exact_length": 3}}
    sampled = {"text": "one", "sampling": True, "samples": 5, "constraints": {"exact_length": 3}}
    with make_client(max_work=24) as client:
        assert client.post("/v1/translate", json=body).status_code == 200
        assert client.post("/v1/translate", json=sampled).status_code == 200
    with make_client(start=False, max_work=23, timeout_s=2) as client:
        assert_error(client.post("/v1/translate", json=body), 422, "too_much_work", "24",
                     "23", "beam")
        assert_error(client.post("/v1/translate", json={**sampled, "samples": 6}), 422,
                     "too_much_work", "24")


def test_a_model_without_attention_counts_no_attention_weights(served_models, monkeypatch):
    """Its response carries none ("attention": null). Before: they were counted, and a
    request the page sends (attention ticked) could be refused for weights never made."""
    from xinda.serve import tasks

    translator = served_models["numbers"].translator
    options = {"decode": {}, "attention": True, "constraints": {}}
    inputs = [("one two three", None)] * 8
    assert tasks.translate_measures(translator, options, inputs)[1] > 0
    monkeypatch.setattr(type(translator.model), "has_attention", property(lambda _: False))
    work, weights = tasks.translate_measures(translator, options, inputs)
    assert weights == 0 and work == tasks.translate_work(translator, options, inputs)


def test_attention_weights_are_limited(make_client, served_models):
    """Before: only decoder steps were bounded, and one request with attention at n_best 32
    and a long exact length answered 57 MB of JSON built on the event loop."""
    translator = served_models["numbers"].translator
    sources = sum(len(translator.source_ids(t, False)) + 1 for t in ("one", "two"))
    size = 2 * 4 * sources  # n_best x (3 tokens + EOS) x (source tokens + EOS), per text
    body = {"text": ["one", "two"], "beam": 2, "n_best": 2, "attention": True,
            "constraints": {"exact_length": 3}}
    with make_client(max_attention=size) as client:
        response = client.post("/v1/translate", json=body)
        assert response.status_code == 200, response.text
        rows = [h["attention"] for t in response.json()["translations"] for h in t["nbest"]]
        assert sum(len(r) * len(r[0]) for r in rows) == size  # the bound is reached exactly
    with make_client(start=False, max_attention=size - 1, timeout_s=2) as client:
        assert_error(client.post("/v1/translate", json=body), 422, "too_much_work",
                     f"{size:,} attention weights", "n_best")
        body["attention"] = False  # then no weights are sent: nothing to bound
        assert client.post("/v1/translate", json=body).status_code == 504  # queued, not refused


def test_the_default_work_limit(client):
    """An ordinary batch passes; 64 texts at beam 32 with a long exact length, or 64 long first
    lines of couplets at n_best 32, do not."""
    lines = [NUMBERS] * 64
    assert post(client, "/v1/translate", model="numbers", text=lines, beam=5).status_code == 200
    assert_error(post(client, "/v1/translate", model="numbers", text=lines, beam=32, n_best=32,
                      constraints={"exact_length": 1023}), 422, "too_much_work", "250,000")
    assert_error(post(client, "/v1/couplet", model="couplet", text=["春风" * 60] * 64,
                      n_best=32), 422, "too_much_work", "250,000")
    assert post(client, "/v1/translate", model="numbers", text="one").status_code == 200


def test_a_wrong_method_or_path_is_405_or_404_whatever_its_body(client):
    """Before: the body checks ran first, so a PUT with a text body was told to send JSON
    (415) and only then got its 405 (found by review)."""
    text = {"Content-Type": "text/plain"}
    assert_error(client.put("/v1/translate", content=b"x", headers=text), 405,
                 "method_not_allowed")
    assert_error(client.post("/health", content=b"x", headers=text), 405, "method_not_allowed")
    assert_error(client.post("/no/such/path", content=b"\xff", headers=text), 404, "not_found")
    # before: a 307 with no body to the path without its "/", before any check (by review)
    assert_error(client.post("/v1/translate/", content=b"{}"), 404, "not_found")
    assert_error(client.get("/health/"), 404, "not_found")
    assert_error(client.post("/v1/translate", content=b"x", headers=text), 415,
                 "unsupported_media_type")


def test_poems_count_against_max_work(make_client):
    """Before: a poem measured no work, so any acrostic and n_best was queued (found by
    review). 16 lines of 5 characters and their marks: 2 x 96 + 1 = 193 steps per row."""
    with make_client(("poetry",), max_work=2000) as client:
        assert_error(post(client, "/v1/poem", acrostic="春" * 16, form=5, n_best=32), 422,
                     "too_much_work", "6,176 decoder steps")
        assert post(client, "/v1/poem", acrostic="春夏秋冬", form=5).status_code == 200


def test_not_found_and_method_not_allowed_are_json(client):
    assert_error(client.get("/v1/nothing"), 404, "not_found")
    assert_error(client.get("/nothing.js"), 404, "not_found")
    # before: 404 from the page's catch-all mount at /
    assert_error(client.get("/v1/translate"), 405, "method_not_allowed")
    assert_error(client.post("/health"), 405, "method_not_allowed")
    assert_error(client.post("/"), 405, "method_not_allowed")


def test_web_page_and_docs(client):
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    for name, kind in (("app.js", "javascript"), ("style.css", "text/css")):
        part = client.get(f"/{name}")
        assert part.status_code == 200 and kind in part.headers["content-type"], name
    assert client.get("/docs").status_code == 200
    schema = client.get("/openapi.json").json()
    paths = schema["paths"]
    assert {"/v1/translate", "/v1/couplet", "/v1/poem", "/v1/models", "/health"} <= set(paths)
    # the key's headers are declared: /docs offers to send them (before: no Authorize button,
    # so every "Try it out" got 401 with --api-key; found by review)
    schemes = schema["components"]["securitySchemes"]
    assert {"type": "apiKey", "in": "header", "name": "X-API-Key"}.items() <= \
        schemes["APIKeyHeader"].items()
    assert schemes["HTTPBearer"]["scheme"] == "bearer"
    assert {"APIKeyHeader": []} in paths["/v1/translate"]["post"]["security"]


def test_the_pages_beam_and_n_best_stop_at_the_apis_limit(client):
    """Before: the page offered up to 64, and the API refused anything above 32 with a 422."""
    from xinda.serve.schemas import MAX_BEAM

    page = client.get("/").text
    for name in ("beam", "n-best", "couplet-n-best", "poem-n-best"):
        field = re.search(rf'<input id="{name}"[^>]*>', page).group(0)
        assert f'max="{MAX_BEAM}"' in field, field


def test_a_model_is_named_by_the_folder_as_given(served_model_dir, tmp_path, monkeypatch):
    """Before: a symbolic link was followed to its target's name, so two models kept as
    "model" folders could not be served together even through links."""
    (tmp_path / "couplet").symlink_to(served_model_dir)
    models = load_models([served_model_dir, tmp_path / "couplet"])
    assert set(models) == {"numbers", "couplet"}
    monkeypatch.chdir(served_model_dir)
    assert set(load_models(["."])) == {"numbers"}


def test_models_served_in_int8(served_model_dir, served_models):
    """``load_models(..., precision="int8")`` (``xinda serve --precision int8``): the model says
    its precision, its int8 copy is made at load time, and it translates."""
    models = load_models([served_model_dir], precision="int8")
    served = models["numbers"]
    assert served.info()["precision"] == "int8" and served.translator._int8 is not None
    with TestClient(create_app(models, ServeSettings()), base_url="http://127.0.0.1") as client:
        got = post(client, "/v1/translate", text=["one two", "three"]).json()["translations"]
    assert [len(t["nbest"]) for t in got] == [1, 1]
    assert served_models["numbers"].info()["precision"] == "fp32"  # the others are untouched
    auto = load_models([served_model_dir], precision="auto")["numbers"].info()["precision"]
    assert auto in ("fp32", "bf16")  # what "auto" chose here (before: "auto")
    assert served.info()["int8_scale"] == "batch"
    assert served_models["numbers"].info()["int8_scale"] is None


def test_models_served_in_int8_with_per_row_scales(served_model_dir):
    """``xinda serve --precision int8 --int8-scale row``: a request's outputs do not depend
    on the requests batched with it; the model says so."""
    from xinda.models.quantize import Int8Linear

    served = load_models([served_model_dir], "cpu", "int8", "row")["numbers"]
    assert served.info()["int8_scale"] == "row"
    assert {m.per_row for m in served.translator._int8.modules()
            if isinstance(m, Int8Linear)} == {True}
    with pytest.raises(XindaError, match="--int8-scale: used only with int8 decoding"):
        load_models([served_model_dir], "cpu", None, "row")  # (an fp32 model: refused)


def test_served_models_decode_in_the_servers_process(served_model_dir, monkeypatch):
    """A model trained with ``decode.workers: 2`` is served with one: the server batches the
    requests in its worker thread, and forking a threaded server is not safe."""
    load = Translator.load

    def with_workers(model_dir, **kwargs):
        translator = load(model_dir, **kwargs)
        translator.cfg.decode.workers = 2
        return translator
    monkeypatch.setattr(Translator, "load", staticmethod(with_workers))
    served = load_models([served_model_dir])["numbers"]
    assert served.translator.cfg.decode.workers == 1


def test_a_405_names_every_method_the_path_takes(client):
    """RFC 9110 15.5.6: a 405 carries Allow with the path's methods, HEAD too where the
    server answers it (before: "GET" alone on /health, /v1/models and /metrics; review)."""
    for path, allowed in (("/health", {"GET", "HEAD"}), ("/v1/models", {"GET", "HEAD"}),
                          ("/metrics", {"GET", "HEAD"}), ("/v1/translate", {"POST"})):
        response = client.put(path)
        assert response.status_code == 405, path
        assert set(response.headers["allow"].replace(" ", "").split(",")) == allowed, path
        if "HEAD" in allowed:
            assert client.head(path).status_code == 200, path
