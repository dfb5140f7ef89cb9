"""The Celery app of the compare scenario: one trivial task, broker and results in a database.

No Redis or RabbitMQ here, so the broker is kombu's SQLAlchemy transport
(``sqla+...``) and the results go to Celery's database backend (``db+...``), both
named by the environment (``BENCH_CELERY_BROKER``, ``BENCH_CELERY_BACKEND``).
The scenario starts the worker as ``celery -A benchmarks.processes.celery_app worker``.
"""

from __future__ import annotations

import os

from celery import Celery
from kombu.transport import sqlalchemy as sql_transport

app = Celery(
    "bench_compare",
    broker=os.environ.get("BENCH_CELERY_BROKER", "sqla+sqlite:///celery-broker.sqlite"),
    backend=os.environ.get("BENCH_CELERY_BACKEND", "db+sqlite:///celery-results.sqlite"),
)
# The virtual transport sleeps this long whenever the queue is empty (default 1 s);
# a short poll keeps the idle worker from adding a second to a sample's start. Set
# on the class: this transport hands every transport option to create_engine().
sql_transport.Transport.polling_interval = 0.01
app.conf.broker_connection_retry_on_startup = True
app.conf.worker_hijack_root_logger = False


@app.task(name="bench.trivial")
def trivial(index: int) -> int:
    return index
