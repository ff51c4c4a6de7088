"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}``.

Every failure a client can see goes through :class:`APIError`, so the body always has
OpenAI's shape and names the offending field in ``param`` (the ``openai`` client reads
it into ``BadRequestError.param``).
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger("draftwise.server")

#: OpenAI's ``type`` per status code
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    500: "internal_server_error",
    503: "service_unavailable_error",
}

#: pydantic's names for union branches, which are not field names
_UNION_TAGS = {"str", "int", "float", "bool", "none", "list", "dict"}


class APIError(Exception):
    """An error answered with an OpenAI-shaped body."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        type_: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.type = type_ or _TYPES.get(status, "api_error")

    def body(self) -> dict[str, Any]:
        """The JSON body (also sent as an SSE ``data:`` event when a stream fails)."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self, close: bool = False) -> JSONResponse:
        """The HTTP response; ``close`` ends the connection after it (unread body, cap)."""
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else {}
        if close:
            headers["Connection"] = "close"
        return JSONResponse(self.body(), status_code=self.status, headers=headers or None)


def loc_to_param(loc: tuple[Any, ...]) -> str | None:
    """``("body", "messages", 0, "content")`` -> ``"messages[0].content"``."""
    parts = list(loc[1:] if loc and loc[0] == "body" else loc)
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str):
            if part in _UNION_TAGS or "[" in part or part.startswith("function-"):
                break  # a union branch tag: the field path ends here
            out += f".{part}" if out else part
    return out or None


def from_validation(errors: list[Any], prefix: str = "") -> APIError:
    """A 400 from pydantic errors, naming the first offending field."""
    if not errors:
        return APIError("invalid request body")
    err = errors[0]
    if err.get("type") == "json_invalid":
        ctx = err.get("ctx") or {}
        return APIError(
            f"the request body is not valid JSON: {ctx.get('error', err.get('msg'))}",
            code="invalid_json",
        )
    loc = tuple(err.get("loc", ()))
    param = loc_to_param(loc)
    if param is None and err.get("type") == "model_attributes_type":
        return APIError("the request body must be a JSON object", code="invalid_json")
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    if err.get("type") == "extra_forbidden":
        msg = "unrecognized request argument"
    elif err.get("type") == "missing":
        msg = "this field is required"
    elif "input" in err and str(err.get("type", "")).endswith(("_type", "_parsing")):
        shown = json.dumps(err["input"], default=str)
        if len(shown) <= 60:
            msg = f"{msg} (got {shown})"
    full = f"{prefix}{param}" if param else prefix.rstrip(".") or None
    return APIError(f"{full}: {msg}" if full else msg, param=full, code="invalid_value")


def from_sampling_error(exc: ValidationError) -> APIError:
    """SamplingParams refusals (its validators name the field) as a 400."""
    return from_validation(list(exc.errors()))


def install_handlers(app: FastAPI) -> None:
    """Route every framework error through :class:`APIError`."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return from_validation(list(exc.errors())).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        try:
            phrase = HTTPStatus(exc.status_code).phrase
        except ValueError:
            phrase = "error"
        detail = exc.detail if isinstance(exc.detail, str) else phrase
        return APIError(detail, status=exc.status_code).response()

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error", exc_info=exc)
        return internal_error(exc).response()


def internal_error(exc: BaseException) -> APIError:
    """A 500 that says what went wrong without a traceback."""
    return APIError(f"internal error: {type(exc).__name__}: {exc}", status=500)
