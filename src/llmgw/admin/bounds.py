"""The admin API's parameter bounds that llmgw-ctl checks before it asks: kept apart
from the handlers (quart's, llmgw[server]) so the client runs on llmgw[ctl] alone."""

from __future__ import annotations

import re

__all__ = [
    "DEFAULT_HEAP_LINES",
    "DEFAULT_PROFILE_SECONDS",
    "MAX_HEAP_LINES",
    "MAX_PROFILE_SECONDS",
    "MIN_BUCKET",
    "MOMENT",
    "MOMENT_RE",
    "PROFILE_FORMATS",
]

# /api/v1/debug (llmgw.admin.debug).
#: The longest profile the API takes unless the app says otherwise.
MAX_PROFILE_SECONDS = 60
DEFAULT_PROFILE_SECONDS = 10
#: format -> content type of the answer.
PROFILE_FORMATS = {
    "text": "text/plain",
    "speedscope": "application/json",
    "html": "text/html",
}
MAX_HEAP_LINES = 1000
DEFAULT_HEAP_LINES = 50

# /api/v1/usage (llmgw.admin.usage).
#: A bucket smaller than this would return a row per request.
MIN_BUCKET = 1.0
# Exactly what `since` and `until` take (the OpenAPI document shows the same pattern):
# Unix seconds, or a duration meaning that long ago.
_NUMBER = r"[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?"
_DURATION = r"([0-9]+(\.[0-9]+)?(ms|s|m|h|d))+"
MOMENT = f"{_NUMBER}|{_DURATION}"
MOMENT_RE = re.compile(MOMENT)
