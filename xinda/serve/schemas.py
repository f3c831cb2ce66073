"""The JSON contract: request and response models (strict types, unknown keys refused) and the
fixed bounds on decode settings. Limits that are server settings (texts per request, characters
per text) are checked by the app, with their own error codes."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from xinda.apps.poetry import split_keywords
from xinda.utils import visible_text

MAX_BEAM = 32  # beam, n_best and samples
MAX_BAN = 256  # banned words per request
MAX_WORD = 100  # characters per banned word
MAX_NGRAM = 16
MAX_LENGTH = 1024  # exact_length
MAX_ACROSTIC = 16  # lines of an acrostic poem
MAX_NAME = 200  # characters of a model name
# items of a list field (texts, prefixes, keywords), refused before the items are checked: 500k
# wrong-typed items took pydantic seconds on the event loop (ServeSettings.max_texts <= this)
MAX_ITEMS = 10_000
Name = Annotated[str | None, Field(max_length=MAX_NAME, description="a served model's name; "
                                   "optional when one model is served")]
Texts = Annotated[str | Annotated[list[str], Field(max_length=MAX_ITEMS)],
                  Field(description="one line or a list of lines")]
NBestCount = Annotated[int | None, Field(ge=1, le=MAX_BEAM)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Constraints(Strict):
    prefix: Annotated[list[str], Field(max_length=MAX_ITEMS)] | None = Field(
        None, description="a target prefix per text ('' = none)")
    ban: list[Annotated[str, Field(max_length=MAX_WORD)]] = Field(
        default_factory=list, max_length=MAX_BAN, description="target pieces or one-piece words")
    no_repeat_ngram: int = Field(0, ge=0, le=MAX_NGRAM, description="0 = off")
    ban_source_copy: bool = False
    exact_length: int | None = Field(None, ge=0, le=MAX_LENGTH, description="output pieces")


class TranslateRequest(Strict):
    model: Name = None
    text: Texts
    beam: int | None = Field(None, ge=1, le=MAX_BEAM)
    n_best: NBestCount = None
    alpha: float | None = Field(None, ge=0, le=10)
    stop: Literal["beam", "best"] | None = Field(None, description="end a beam search after "
                                                 "`beam` finished or once the best ended")
    sampling: bool | None = None
    temperature: float | None = Field(None, gt=0, le=100)
    top_k: int | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    samples: NBestCount = None
    attention: bool = False
    constraints: Constraints | None = None

    def decode_options(self) -> dict:
        """The given decode settings, as ``DecodeConfig`` fields."""
        given = {"beam": self.beam, "nbest": self.n_best, "alpha": self.alpha,
                 "stop": self.stop, "sampling": self.sampling, "temperature": self.temperature,
                 "top_k": self.top_k, "top_p": self.top_p, "seed": self.seed,
                 "samples": self.samples}
        return {k: v for k, v in given.items() if v is not None}


class CoupletRequest(Strict):
    model: Name = None
    text: Texts = Field(description="first lines (上联)")
    n_best: NBestCount = None
    tone: bool = False
    no_copy: bool = False


class PoemRequest(Strict):
    model: Name = None
    keywords: str | Annotated[list[str], Field(max_length=MAX_ITEMS)] = Field(
        default_factory=list, description="a list, or one string separated by spaces or commas")
    acrostic: str = Field("", max_length=MAX_ACROSTIC, description="藏头: first characters")
    form: int = Field(7, description="characters per line: 5 or 7")
    rhyme: bool = False
    n_best: NBestCount = None

    def keyword_list(self) -> tuple[str, ...]:
        words = split_keywords(self.keywords) if isinstance(self.keywords, str) \
            else [w.strip() for w in self.keywords]
        return tuple(w for w in words if visible_text(w))  # invisible ones are no keyword


class Hypothesis(BaseModel):
    text: str
    score: float | None  # None where the score is not finite
    source_pieces: list[str] | None = None
    target_pieces: list[str] | None = None
    attention: list[list[float]] | None = Field(None, description="only when asked (null for "
                                                "a model without attention): rows = target "
                                                "pieces + EOS, cols = source pieces + EOS")


class Translated(BaseModel):
    source: str
    nbest: list[Hypothesis]
    error: str | None = None
    truncated_from: int | None = None


class TranslateResponse(BaseModel):
    model: str
    translations: list[Translated]


class Couplet(BaseModel):
    source: str
    nbest: list[Hypothesis]
    error: str | None = None


class CoupletResponse(BaseModel):
    model: str
    couplets: list[Couplet]


class Poem(BaseModel):
    text: str
    lines: list[str]
    score: float | None


class PoemResponse(BaseModel):
    model: str
    poems: list[Poem]
    error: str | None = None


class ModelInfo(BaseModel):
    name: str
    task: str
    arch: str
    src_lang: str
    tgt_lang: str
    precision: str  # the decoding precision: fp32 | bf16 | int8 (auto resolved)
    # int8: its activations' scales, "batch" (an output can change with the requests batched
    # with it) or "row" (not by their ranges); None for the other precisions
    int8_scale: str | None = None
    sampling: bool  # its outputs are samples (decode.sampling): beam and n_best do not apply


class ModelsResponse(BaseModel):
    models: list[ModelInfo]


class Health(BaseModel):
    status: str
    models: list[str]


class ErrorBody(BaseModel):
    code: str
    message: str


class ErrorResponse(BaseModel):
    error: ErrorBody
