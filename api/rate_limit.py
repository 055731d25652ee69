"""Requests per API key (`rate_limit`, in the `limits` library's notation: "50/second",
"1000/minute", several separated by ";"), counted in a moving window by `limits`.

The count lives in Redis in production (`rate_limit_storage_url`, else the broker's Redis when the
broker is Redis), so every API process shares it; in memory for the embedded install (SQLite
broker: one API process). Over the limit: 429 `rate_limit_exceeded`, `Retry-After` = seconds until
the window has room again, the message naming the limit.

Checked by the authentication dependencies (api/deps.py) once the key is known, so every
authenticated route is limited and the open ones (/healthz, /readyz, /metrics, the dashboard's
files) are not. When the store is unreachable (Redis down) requests are let through rather than
failed: the limit protects the service, it must not take it down. That is logged once per change,
and the store is tried again every `STORE_RETRY_SECONDS`.
"""

from __future__ import annotations

import logging
import math
import threading
import time

from limits import RateLimitItem, parse_many
from limits.errors import StorageError
from limits.storage import storage_from_string
from limits.strategies import MovingWindowRateLimiter

from api.errors import APIError
from core.settings import Settings

log = logging.getLogger("fromscratch.api")

STORE_RETRY_SECONDS = 5.0  # after a store failure, let requests through this long before trying again
REDIS_TIMEOUT_SECONDS = 0.5  # a slow store must not slow every request down


def storage_url(settings: Settings) -> str:
    """Where the counts live: the explicit setting, else the broker's Redis, else this process."""
    if settings.rate_limit_storage_url:
        return settings.rate_limit_storage_url
    if settings.broker_url.startswith(("redis://", "rediss://")):
        return settings.broker_url
    return "memory://"


def rate_limited(item: RateLimitItem, spec: str, retry_after: int) -> APIError:
    per = f"{item.multiples} {item.GRANULARITY.name}s" if item.multiples > 1 else item.GRANULARITY.name
    return APIError(
        429,
        f"Rate limit reached for this API key: {item.amount} requests per {per} "
        f"(rate_limit={spec!r}, setting FROMSCRATCH_RATE_LIMIT). Try again in {retry_after} s.",
        code="rate_limit_exceeded",
        type="requests",  # OpenAI's type for a requests-per-period limit (its token limits say "tokens")
        headers={"Retry-After": str(retry_after)},
    )


class RateLimiter:
    def __init__(self, limits: str, storage: str) -> None:
        self.spec = limits
        try:
            self.items = parse_many(limits)
        except ValueError as e:
            raise ValueError(f"rate_limit={limits!r} is not in the `limits` notation (e.g. 50/second)") from e
        options: dict[str, float | str | bool] = {}
        if storage.startswith(("redis", "rediss")):
            options = {
                "socket_timeout": REDIS_TIMEOUT_SECONDS,
                "socket_connect_timeout": REDIS_TIMEOUT_SECONDS,
            }
        self.storage_name = storage.split("://", 1)[0]
        self.strategy = MovingWindowRateLimiter(storage_from_string(storage, wrap_exceptions=True, **options))
        self._lock = threading.Lock()
        self._store_down = False
        self._retry_store_at = 0.0

    @classmethod
    def from_settings(cls, settings: Settings) -> RateLimiter:
        return cls(settings.rate_limit, storage_url(settings))

    def check(self, identity: str) -> None:
        """Count one request of `identity` (an API key id); APIError 429 when over a limit."""
        if self._store_down and time.monotonic() < self._retry_store_at:
            return
        try:
            for item in self.items:
                if not self.strategy.hit(item, identity):
                    reset_at = self.strategy.get_window_stats(item, identity).reset_time
                    self._store_is(up=True)
                    raise rate_limited(item, self.spec, max(1, math.ceil(reset_at - time.time())))
        except StorageError as e:
            self._store_is(up=False, error=e)
            return
        self._store_is(up=True)

    def _store_is(self, up: bool, error: StorageError | None = None) -> None:
        with self._lock:
            if up and self._store_down:
                log.info("rate limit store (%s) reachable again: limiting requests again", self.storage_name)
            elif not up:
                self._retry_store_at = time.monotonic() + STORE_RETRY_SECONDS
                if not self._store_down:
                    reason = error.storage_error if error is not None else "unknown"
                    log.warning(
                        "rate limit store (%s) unreachable (%s): requests are not limited until it is back",
                        self.storage_name,
                        type(reason).__name__,
                    )
            self._store_down = not up
