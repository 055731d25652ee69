"""Queues by device count (issue 12): a training job asking for `devices: N` waits in the queue
`<queue>` when N is 1 (the cpu and gpu queues as they always were) and `<queue>.<N>` otherwise
(`gpu.4`). A worker with D devices consumes its queue for every count from 1 to D, so it only ever
receives a job it has the devices for: the routing, not a check after the message is taken,
guarantees that a job never half-starts. Import-light (no Celery, no torch): the API uses it.

The job row stores the routed name in `jobs.queue`, so every place that sends a job again (the
reaper, a shutdown hand-back, the running quota, resume) sends it to the same routed queue.
"""

from __future__ import annotations

from core.settings import MAX_DEVICES, QUEUES


def job_queue(queue: str, devices: int) -> str:
    """The broker queue of a job of `devices` devices on the training queue `queue`."""
    if queue not in QUEUES:
        raise ValueError(f"unknown queue {queue!r}: use one of {QUEUES}")
    if not 1 <= devices <= MAX_DEVICES:
        raise ValueError(f"devices={devices}: use 1 to {MAX_DEVICES}")
    return queue if devices == 1 else f"{queue}.{devices}"


def split_queue(name: str) -> tuple[str, int] | None:
    """(training queue, devices) of a routed queue name; None for a name that is not one."""
    base, dot, count = name.partition(".")
    if base not in QUEUES:
        return None
    if not dot:
        return base, 1
    if not count.isdigit() or count.startswith("0"):
        return None
    devices = int(count)
    return (base, devices) if 2 <= devices <= MAX_DEVICES else None


def consumed_queues(queues: list[str], devices: int) -> list[str]:
    """The broker queues a worker of `devices` devices consumes for its training `queues`: every
    count it can run, largest first (so the order names what it is for). Other queues (inference)
    are passed through."""
    out: list[str] = []
    for queue in queues:
        if queue in QUEUES:
            out.extend(job_queue(queue, n) for n in range(devices, 0, -1))
        else:
            out.append(queue)
    return out
