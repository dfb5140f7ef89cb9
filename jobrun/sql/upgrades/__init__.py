"""Bringing a database to this code's schema, and checking that it may run there.

* :mod:`~jobrun.sql.upgrades.migrate`: jobrun's Alembic revisions run on a host's
  engine (``jobrun.upgrade``), one migrator at a time.
* :mod:`~jobrun.sql.upgrades.host_alembic`: the same revisions inside a host's own
  Alembic environment (``jobrun.migrate_on_connection``, ``jobrun.skip_jobrun_tables``).
* :mod:`~jobrun.sql.upgrades.provisioning`: many tenant databases upgraded in one go
  (``jobrun.upgrade_many``).
* :mod:`~jobrun.sql.upgrades.compat`: the compatibility record a store reads at its
  first operation, so code older than the database refuses to run.

The revisions themselves are in ``migrations/`` at the repository's root (in the
wheel: ``jobrun/_migrations``). Alembic is imported only by what migrates.
"""
