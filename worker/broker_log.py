"""A broker outage in the worker's log: two lines, not one per reconnect try.

Celery's consumer logs "Connection to broker lost" and then "Cannot connect to ...: Trying again in
N seconds... (k/100)" at every try of its reconnect loop, and a task that ends while the broker is
away logs "Couldn't ack" with a traceback. `install_outage_filter()` puts a filter on those loggers
that turns the first of these into "broker unreachable: worker consumer (...)", drops the rest, and
turns the "Connected to ..." that ends the outage into "broker reachable again after N s: worker
consumer" (core.broker_faults.BrokerOutageLog). Startup is logged as before.
"""

from __future__ import annotations

import logging

from core.broker_faults import BrokerOutageLog, is_broker_error

CONSUMER_LOGGER = "celery.worker.consumer.consumer"
CONNECTION_LOGGER = "celery.worker.consumer.connection"
REQUEST_LOGGER = "celery.worker.request"
# the start of what Celery logs while its broker connection is gone (celery/worker/consumer/consumer.py,
# kombu/message.py)
_OUTAGE_STARTS = ("consumer: Connection to broker lost", "consumer: Cannot connect to", "Couldn't ack")

log = logging.getLogger("worker.broker")


class BrokerOutageFilter(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.outage = BrokerOutageLog("worker consumer", log)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name in (CONSUMER_LOGGER, REQUEST_LOGGER):
            message = record.getMessage()
            if not message.startswith(_OUTAGE_STARTS):
                return True
            error = next((a for a in record.args or () if isinstance(a, BaseException)), None)
            if record.name == REQUEST_LOGGER and not (error is not None and is_broker_error(error)):
                return True  # not the broker's fault: keep Celery's line and its traceback
            self.outage.failed(error if error is not None else message.splitlines()[0])
            return False
        back = record.name == CONNECTION_LOGGER and record.getMessage().startswith("Connected")
        if back and self.outage.down:
            self.outage.reachable()
            return False
        return True


_installed: BrokerOutageFilter | None = None


def install_outage_filter() -> BrokerOutageFilter:
    """Once per process."""
    global _installed
    if _installed is None:
        _installed = BrokerOutageFilter()
        for name in (CONSUMER_LOGGER, CONNECTION_LOGGER, REQUEST_LOGGER):
            logging.getLogger(name).addFilter(_installed)
    return _installed
