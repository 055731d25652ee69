"""Secrets never reach the logs: `?api_key=<key>` (the SSE route's key for a browser's EventSource,
api/deps.py) is part of the URL, and uvicorn's access log writes every URL with its query string.

`RedactSecrets` is a logging filter that rewrites a record's message and arguments with every
`api_key=` value (its name percent-encoded too) and every `fsk-...` key replaced by `***`;
`install_log_redaction()` puts it on the loggers that write URLs (uvicorn's access and error logs,
ours). Idempotent, so every app built in one process may call it.
"""

from __future__ import annotations

import logging
import re


def _spelled(name: str) -> str:
    """A regex for `name` with any of its characters percent-encoded (Starlette decodes them)."""
    return "".join(f"(?:{re.escape(ch)}|%{ord(ch):02x})" for ch in name)


# the value of an `api_key` query parameter, however its name is spelled
SECRET_QUERY = re.compile(rf"(?i)((?:^|[?&\s\"';])\s*{_spelled('api_key')}=)[^&\s\"']*")
# a key wherever it appears (core.keys.SECRET_PREFIX): a client may put one where it does not belong
SECRET_KEY = re.compile(r"fsk-[A-Za-z0-9_\-]{4,}")
REDACTED = "***"
URL_LOGGERS = ("uvicorn.access", "uvicorn.error", "fromscratch.api")


def redact(text: str) -> str:
    text = SECRET_QUERY.sub(lambda m: m.group(1) + REDACTED, text)
    return SECRET_KEY.sub("fsk-" + REDACTED, text)


def _redacted(value: object) -> object:
    return redact(value) if isinstance(value, str) else value


class RedactSecrets(logging.Filter):
    """Redacts the message and each of its arguments in place (uvicorn's access formatter reads the
    arguments as a tuple, so they keep their shape)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = _redacted(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_redacted(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: _redacted(v) for k, v in record.args.items()}
        return True


LOG_FORMAT = "[%(asctime)s: %(levelname)s] %(name)s: %(message)s"  # as the workers' (worker/cli.py)


def install_api_logging() -> None:
    """The API's own lines (fromscratch.*) at INFO with a time, level and logger name: under a bare
    `uvicorn` nothing configures them, and Python then prints warnings alone, as bare text. A
    process that set up logging already (a test, an embedding app) keeps its own."""
    ours = logging.getLogger("fromscratch")
    if ours.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    ours.addHandler(handler)
    ours.setLevel(logging.INFO)


def install_log_redaction() -> None:
    for name in URL_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactSecrets) for f in logger.filters):
            logger.addFilter(RedactSecrets())
