"""OpenAI-shaped errors raised anywhere in the server and rendered once, by a middleware."""

from __future__ import annotations

from typing import Any


class GatewayError(Exception):
    """An error with its HTTP status and OpenAI error fields."""

    def __init__(self, status: int, message: str, *, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.headers = headers  # sent with the error (e.g. Retry-After)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = "invalid_value") -> GatewayError:
    return GatewayError(400, message, param=param, code=code)


def upstream_error(message: str) -> GatewayError:
    return GatewayError(502, message, type_="upstream_error", code="upstream_error")


def upstream_timeout(message: str) -> GatewayError:
    return GatewayError(504, message, type_="upstream_error", code="upstream_timeout")
