"""The admin API client of `llmgw-ctl`: one call, its JSON, and every failure as one
line (unreachable, refused, an error answer with the API's own message)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import httpx

from llmgw_cli._common import EXIT_RUNTIME, EXIT_USAGE, CliError


def _reason(exc: httpx.HTTPError) -> str:
    text = str(exc) or type(exc).__name__
    # "[Errno 111] Connection refused" -> "connection refused"
    if text.startswith("[Errno") and "] " in text:
        text = text.split("] ", 1)[1]
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    return text[:1].lower() + text[1:]


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _api_error(resp: httpx.Response) -> str | None:
    """The message of an error answer (with the parameter at fault when the message
    does not start with it), or None when the body has none."""
    try:
        obj = resp.json()
    except ValueError:
        return None
    if isinstance(obj, dict):
        err = obj.get("error", obj.get("detail", obj.get("message")))
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            message = _one_line(err["message"])
            param = err.get("param")
            if isinstance(param, str) and param and not message.startswith(param):
                message += f" (param {param})"
            return message
        if isinstance(err, str):
            return _one_line(err)
    return None


def admin_call(
    admin: str,
    method: str,
    path: str,
    *,
    params: Sequence[tuple[str, str]] = (),
    body: Any = None,
    key: str | None = None,
    timeout: float = 10.0,
    raw: bool = False,
) -> Any:
    """One admin API call (`body`, when given, sent as JSON); its JSON (with `raw`, the
    httpx response itself), or CliError(EXIT_RUNTIME) with a one-line reason."""
    url = f"{admin.rstrip('/')}/api/v1/{path}"
    headers = {"accept": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    try:
        resp = httpx.request(
            method,
            url,
            params=list(params),
            json=body,
            headers=headers,
            timeout=timeout,
            trust_env=False,
        )
    except httpx.InvalidURL as exc:
        raise CliError(f"invalid --admin URL {admin!r}: {exc}", EXIT_USAGE) from None
    except httpx.UnsupportedProtocol:
        raise CliError(
            f"invalid --admin URL {admin!r}: use http:// or https://", EXIT_USAGE
        ) from None
    except httpx.HTTPError as exc:
        raise CliError(f"cannot reach admin API at {admin}: {_reason(exc)}", EXIT_RUNTIME) from None
    detail = _api_error(resp)
    if resp.status_code == 404:
        what = detail or f"no /api/v1/{path}"
        raise CliError(f"admin API at {admin}: {what} (404 Not Found)", EXIT_RUNTIME)
    if resp.status_code in (401, 403):
        hint = "" if key else "; pass --admin-key"
        why = f" {detail}" if detail else ""
        raise CliError(
            f"admin API refused {method} /api/v1/{path}: {resp.status_code}{why}{hint}",
            EXIT_RUNTIME,
        )
    if resp.status_code >= 400:
        reason = detail or resp.reason_phrase
        raise CliError(
            f"admin API answered {resp.status_code} to {method} /api/v1/{path}: {reason}",
            EXIT_RUNTIME,
        )
    if raw:
        return resp
    if not resp.content:
        return None
    try:
        return resp.json()
    except ValueError:
        raise CliError(
            f"admin API at {admin} answered {method} /api/v1/{path} with non-JSON content",
            EXIT_RUNTIME,
        ) from None


def call(args: argparse.Namespace, method: str, path: str, **kw: Any) -> Any:
    """:func:`admin_call` with the global flags: --admin, --admin-key, --timeout."""
    kw.setdefault("timeout", args.timeout)
    return admin_call(args.admin, method, path, key=args.admin_key, **kw)
