"""The rules for a job's MLflow `tracking_uri`, shared by the API (which refuses a bad one with a
400) and the worker (which checks again before its first request, as its own settings say).

A worker calls this URL, so it is a server-side request the user chooses: only http(s), no
credentials in it (they would be stored and shown in the job object; the worker takes them from
its environment), no query or fragment, and, when `allowed_tracker_hosts` lists hosts, only those.
"""

from __future__ import annotations

from urllib.parse import urlsplit

MAX_TRACKING_URI_CHARS = 2048


def tracking_uri_problem(url: str) -> str | None:
    """Why `url` cannot be a tracking URI, or None when it can."""
    if len(url) > MAX_TRACKING_URI_CHARS:
        return f"must be at most {MAX_TRACKING_URI_CHARS} characters"
    if any(c.isspace() or ord(c) < 32 for c in url):
        return "must not hold spaces or control characters"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError as e:
        return f"is not a valid URL ({e})"
    if parts.scheme not in ("http", "https"):
        return "must be an http:// or https:// URL"
    if not parts.hostname:
        return "must name a host"
    if parts.username is not None or parts.password is not None:
        return (
            "must not hold credentials: the worker sends MLFLOW_TRACKING_TOKEN or "
            "MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD from its own environment"
        )
    if parts.query or parts.fragment:
        return "must not have a query or a fragment"
    return None


def host_allowed(url: str, allowed: list[str]) -> bool:
    """Whether `url`'s host is one of `allowed` (lowercase `host` or `host:port` entries); an
    empty list allows any host."""
    if not allowed:
        return True
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    port = parts.port or (443 if parts.scheme == "https" else 80)
    with_port = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # IPv6 in brackets
    return host in allowed or with_port in allowed
