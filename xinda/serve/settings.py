"""Every default of the server, defined once: ``ServeSettings`` (the CLI's options map onto it)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

LOOPBACK = ("127.0.0.1", "localhost", "::1")


class ServeSettings(BaseModel):
    """Server, batching and limit settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_key: str | None = None  # required on any address but loopback
    cors_origins: tuple[str, ...] = ()  # CORS is off when empty
    # batching: one worker per model collects up to max_batch_requests jobs with the same
    # decode options, until their source tokens reach batch_tokens or max_wait_ms has passed
    max_batch_requests: int = Field(32, ge=1)  # 1 = no batching across requests
    batch_tokens: int = Field(4096, ge=1)
    max_wait_ms: float = Field(5.0, ge=0, le=60_000, allow_inf_nan=False)  # below timeout_s
    # limits
    queue_size: int = Field(256, ge=1)  # waiting jobs per model; beyond: 429
    retry_after_s: int = Field(1, ge=1)  # the Retry-After of a 429
    # per request, queueing included; then 504 (not 408, which browsers send again)
    timeout_s: float = Field(30.0, gt=0, le=3600, allow_inf_nan=False)
    max_texts: int = Field(64, ge=1, le=10_000)  # texts per request (schemas.MAX_ITEMS)
    max_chars: int = Field(1000, ge=1)  # characters per text (or of its NFKC form)
    max_body_bytes: int = Field(1 << 20, ge=1)  # request body size; beyond: 413
    # decoder row-steps per request (sum over its texts of beam or samples x output length
    # limit); beyond: 422. 64 texts of 50 tokens at beam 5 take ~28,000
    max_work: int = Field(250_000, ge=1)
    # attention weights in a response that asks for them (outputs x output length limit x
    # source tokens, per text); beyond: 422. ~7 bytes of JSON each
    max_attention: int = Field(1_000_000, ge=1)

    @field_validator("api_key")
    @classmethod
    def _presentable_key(cls, key: str | None) -> str | None:
        """HTTP drops the blanks around a header value: such a key could never match."""
        if key is not None and (not key or key != key.strip() or not key.isprintable()):
            raise ValueError("the API key must be printable characters without surrounding "
                             "blanks (a header cannot carry them)")
        return key

    @model_validator(mode="after")
    def _wait_below_timeout(self) -> ServeSettings:
        if self.max_wait_ms >= 1000 * self.timeout_s:
            raise ValueError(f"max_wait_ms ({self.max_wait_ms:g}) must be below the timeout "
                             f"({self.timeout_s:g} s = {1000 * self.timeout_s:g} ms)")
        return self

    @property
    def loopback(self) -> bool:
        """Whether the server binds a loopback address only."""
        return self.host in LOOPBACK

