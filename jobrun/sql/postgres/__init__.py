"""What the SQL store does on Postgres alone: the transport pieces SQLite has no use for.

* :mod:`~jobrun.sql.postgres.presence`: a driver process's presence, a session
  advisory lock the server frees when the process dies (the proof a takeover needs).
* :mod:`~jobrun.sql.postgres.kept_connections`: the host-pool connections kept
  between operations, so a step costs no pool checkout.
* :mod:`~jobrun.sql.postgres.tenancy`: tenants in Postgres schemas, and the
  wake-up channel each schema's starts NOTIFY on.
* :mod:`~jobrun.sql.postgres.database_clock`: which leases are judged on the
  database's clock.

Each is used by the store (:mod:`jobrun.sql.store`), the executor or the worker on a
Postgres engine only (``schema=`` is refused on any other); SQLite's set-up is
:mod:`jobrun.sql.sqlite_setup`.
"""
