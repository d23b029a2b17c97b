"""The access log: one line per request the client port answered, and the refusals.

A usage sink (the router feeds it every finished or refused request, as it feeds the
store), writing at INFO on the ``llmgw.access`` logger with the request's fields as
structured fields (llmgw.logs); docs/router.md lists them. Refusals are also logged
at DEBUG on ``llmgw.router`` with their reason.
"""

from __future__ import annotations

import logging

from llmgw.domain.usage import UsageRecord
from llmgw.logs import FIELDS

log = logging.getLogger("llmgw.access")
refusals = logging.getLogger("llmgw.router")


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


class AccessLog:
    """Writes each :class:`UsageRecord` as an access line; nothing when INFO is off."""

    def record(self, record: UsageRecord) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        usage = record.usage
        values = {
            "request_id": record.request_id,
            "path": record.path,
            "status": record.status,
            "model": record.model or None,
            "asked": record.asked,
            "fallback": record.fallback,
            "endpoint": record.endpoint,
            "client": record.client,
            "key_name": record.key_name,
            "key_id": record.key_id,
            "band": record.band,
            "tenant": record.tenant,
            "duration": _seconds(record.latency),
            "ttft": _seconds(record.ttft),
            "queue_wait": _seconds(record.queue_wait),
            "retries": record.retries,
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "cached_tokens": usage.cached_tokens,
            "usage_estimated": usage.estimated,
            "error": record.error,
        }
        log.info("%s %s", record.path or "-", record.status, extra={FIELDS: values})


def log_refusal(
    request_id: str, status: int, code: str | None, reason: str, model: str | None
) -> None:
    """The DEBUG line of a request llmgw refused itself, saying why."""
    if refusals.isEnabledFor(logging.DEBUG):
        refusals.debug(
            "refused %s: %s",
            status,
            reason,
            extra={
                FIELDS: {
                    "request_id": request_id,
                    "status": status,
                    "error": code,
                    "model": model or None,
                }
            },
        )
