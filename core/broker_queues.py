"""What the broker holds, read below Celery (which has no API for it): the jobs whose message waits
in a queue (`queued_job_ids`, for the reaper's lost-message check) and moving a message just sent
to the head of its queue (`move_to_head`, so a re-queued job keeps its place).

Written for the two transports the service runs on:
- **Redis** (kombu's redis transport): a queue is a list; senders LPUSH, workers BRPOP from the
  right end, so the right end is the head. Priority lists `<queue>\\x06\\x16<n>` beside it are read
  too (nothing here sends with a priority). A message a worker has taken but not yet acknowledged
  sits in the `unacked` hash, its delivery time in the `unacked_index` sorted set.
- **SQL** (kombu's sqlalchemy transport, the embedded `sqla+sqlite://` broker): one `kombu_message`
  row per message; workers take the visible rows of their queue in (timestamp, id) order, and
  waiting rows have no timestamp, so the lowest id is the head. A taken row stays, invisible.
Any other transport raises `UnsupportedBroker`.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError

if TYPE_CHECKING:
    from celery import Celery
    from kombu import Connection

# Moves the element holding ARGV[1] (a task id) from among the ARGV[2] newest (leftmost) elements
# of the list KEYS[1] to its right end, the head. Atomic: no worker sees the list half-changed.
_MOVE_TO_HEAD = """
local items = redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)
for _, item in ipairs(items) do
  if string.find(item, ARGV[1], 1, true) then
    redis.call('LREM', KEYS[1], 1, item)
    redis.call('RPUSH', KEYS[1], item)
    return 1
  end
end
return 0
"""
_SEARCH_NEWEST = 1000  # a message just sent is among the newest few; more is a bounded safety margin


class UnsupportedBroker(Exception):
    """The broker's transport is neither Redis nor kombu's SQL transport."""


def queued_job_ids(
    celery: Celery, task_name: str, queues: Iterable[str], delivered_within: float = 0.0
) -> list[str]:
    """The job ids of the `task_name` messages waiting in `queues`, head first (the order workers
    take them). On Redis, messages a worker took less than `delivered_within` seconds ago and has
    not acknowledged yet come after them: that worker is about to claim the job. Raises the
    transport's errors when the broker cannot be reached."""
    queues = list(queues)
    with _connect(celery) as conn:
        channel: Any = conn.default_channel
        if conn.transport.driver_type == "redis":
            payloads = _redis_payloads(channel, queues, delivered_within)
        elif conn.transport.driver_type == "sql":
            payloads = _sql_payloads(channel, queues)
        else:
            raise UnsupportedBroker(conn.transport.driver_type)
    ids = (_job_id(payload, task_name) for payload in payloads)
    return [job_id for job_id in ids if job_id is not None]


def move_to_head(celery: Celery, queue: str, task_id: str) -> bool:
    """Move the message of `task_id`, just sent to `queue`, to the head of the queue. False when it
    is no longer waiting there (a worker already took it: it was at the head anyway)."""
    with _connect(celery) as conn:
        channel: Any = conn.default_channel
        if conn.transport.driver_type == "redis":
            moved = channel.client.eval(_MOVE_TO_HEAD, 1, queue, task_id, _SEARCH_NEWEST)
            return bool(moved)
        if conn.transport.driver_type == "sql":
            return _sql_move_to_head(channel, queue, task_id)
        raise UnsupportedBroker(conn.transport.driver_type)


# ------------------------------------------------------------------------------------- transports
def _connect(celery: Celery) -> Connection:
    conn: Connection = celery.connection_for_write()
    conn.ensure_connection(max_retries=1)  # fail fast when the broker is down: the caller retries later
    return conn


def _redis_payloads(channel: Any, queues: list[str], delivered_within: float) -> list[str]:
    client = channel.client
    with client.pipeline(transaction=False) as pipe:
        for queue in queues:
            for priority in channel.priority_steps:
                key = f"{queue}{channel.sep}{priority}" if priority else queue
                pipe.lrange(key, 0, -1)
        lists = pipe.execute()
    payloads = [item for items in lists for item in reversed(items)]  # BRPOP takes the right end first
    if delivered_within > 0:
        recent = client.zrangebyscore(channel.unacked_index_key, time.time() - delivered_within, "+inf")
        if recent:
            for raw in client.hmget(channel.unacked_key, recent):
                if raw is not None:
                    message, _exchange, routing_key = json.loads(raw)
                    if routing_key in queues:
                        payloads.append(json.dumps(message))
    return payloads


def _sql_payloads(channel: Any, queues: list[str]) -> list[str]:
    message, queue = channel.message_cls, channel.queue_cls
    with channel.session as session:  # closed after: this channel's session serves this call only
        rows = session.execute(
            select(message.payload)
            .join(queue, message.queue_id == queue.id)
            .where(queue.name.in_(queues), message.visible.is_(True))
            .order_by(message.sent_at, message.id)
        )
        return [payload for (payload,) in rows]


def _sql_move_to_head(channel: Any, queue_name: str, task_id: str) -> bool:
    """Give the message the lowest id of the table: waiting rows are taken lowest id first."""
    message, queue = channel.message_cls, channel.queue_cls
    with channel.session as session:
        return _sql_renumber(session, message, queue, queue_name, task_id)


def _sql_renumber(session: Any, message: Any, queue: Any, queue_name: str, task_id: str) -> bool:
    queue_id = select(queue.id).where(queue.name == queue_name).scalar_subquery()
    for _ in range(3):  # two movers at once may pick the same id: the loser takes the next one
        lowest = session.scalar(select(func.min(message.id))) or 0
        try:
            result = session.execute(
                update(message)
                .where(
                    message.queue_id == queue_id,
                    message.visible.is_(True),
                    message.payload.contains(task_id, autoescape=True),
                )
                # sent_at: kept empty like every waiting row's (kombu's onupdate would stamp it,
                # and a stamped row is taken after the unstamped ones)
                .values(id=lowest - 1, sent_at=None)
                .execution_options(synchronize_session=False)
            )
            session.commit()
            return bool(result.rowcount)
        except IntegrityError:
            session.rollback()
    return False


def _job_id(raw: str | bytes, task_name: str) -> str | None:
    """The job id a Celery (protocol 2, JSON) message for `task_name` carries; None for others."""
    try:
        message = json.loads(raw)
        if message.get("headers", {}).get("task") != task_name:
            return None
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        return str(args[0]) if args else None
    except (ValueError, KeyError, IndexError, TypeError):
        return None  # not one of ours
