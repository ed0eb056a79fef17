"""Errors the serving layer answers with, following DJL's status-code contract.

Every error carries the HTTP status, a message a user can act on (it names the field, the
value and what would work) and a short ``type``. Protocol adapters render them in their own
shape; ``error_body`` is the LMI/DJL shape ``{"error": msg, "code": N, "type": T}``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from lmi_trt.errors import LmiError


class LmiHttpError(LmiError):
    status: int = 500
    type: str = "InternalServerError"

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        type: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if type is not None:
            self.type = type
        self.headers: dict[str, str] = dict(headers or {})


class BadRequest(LmiHttpError):
    status = 400
    type = "BadRequestError"


class FieldError(BadRequest):
    """A 400 that knows which request field is wrong (OpenAI's ``param``)."""

    def __init__(self, param: str | None, message: str) -> None:
        super().__init__(message)
        self.param = param


class NotFound(LmiHttpError):
    status = 404
    type = "NotFoundError"


class Conflict(LmiHttpError):
    """The resource is taken or in use (a LoRA adapter name registered already, or one requests are using)."""

    status = 409
    type = "ConflictError"


class MethodNotAllowed(LmiHttpError):
    status = 405
    type = "MethodNotAllowedError"


class PayloadTooLarge(LmiHttpError):
    status = 413
    type = "PayloadTooLargeError"


class ModelError(LmiHttpError):
    """A model-side failure (DJL answers 424 for these)."""

    status = 424
    type = "ModelError"


class ServiceUnavailable(LmiHttpError):
    """Overloaded or not ready: 503 with Retry-After so load balancers back off."""

    status = 503
    type = "ServiceUnavailableError"

    def __init__(self, message: str, *, retry_after: int = 1, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.headers.setdefault("Retry-After", str(retry_after))


class OutOfMemory(LmiHttpError):
    status = 507
    type = "OutOfMemoryError"


# Names clients send to a server that serves one model, meaning "whichever it serves":
# huggingface_hub's InferenceClient sends "dummy" when the model is a URL
# (huggingface_hub/inference/_providers/hf_inference.py), "tgi" before that; TGI ignores the field.
UNNAMED_MODEL = frozenset({"dummy", "tgi"})


def check_model(requested: object, served: str, *, also: Collection[str] = ()) -> None:
    """The one rule for a model a request names (path or body): left out, the served name, or one
    of ``also`` (the route's aliases, ``option.model_id``, a body's ``UNNAMED_MODEL``) is this
    server's model; any other name is a 404, as vLLM answers
    (vllm/entrypoints/openai/serving_engine.py, ``_check_model``)."""
    if requested is None:
        return
    if not isinstance(requested, str):  # a raw body value: checked before the request model validates it
        bad = BadRequest(
            f"model must be a string naming the model (this server serves {served!r}), got {type(requested).__name__}"
        )
        bad.param = "model"  # type: ignore[attr-defined]
        raise bad
    if requested == served or requested in also:
        return
    err = NotFound(f"the model {requested!r} does not exist; this server serves {served!r}")
    err.param = "model"  # type: ignore[attr-defined]  (OpenAI's error names the field)
    raise err


def error_from_code(message: str, code: int | None) -> LmiHttpError:
    """Map an engine's ``error_code`` (400/424/503/507/...) to the matching error class."""
    classes: dict[int, type[LmiHttpError]] = {
        400: BadRequest,
        404: NotFound,
        409: Conflict,
        413: PayloadTooLarge,
        424: ModelError,
        503: ServiceUnavailable,
        507: OutOfMemory,
    }
    cls = classes.get(code or 424)
    if cls is not None:
        return cls(message)
    return LmiHttpError(message, status=code)


def error_body(err: LmiHttpError) -> dict[str, Any]:
    return {"error": err.message, "code": err.status, "type": err.type}
