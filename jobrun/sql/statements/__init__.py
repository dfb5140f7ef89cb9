"""Every statement the SQL store sends, as SQLAlchemy Core: one file per facet of the port.

Each statement has one home, in the file of the facet that sends it
(:mod:`jobrun._core.port` names the facets):

* :mod:`~jobrun.sql.statements.runs`: starts, the pass's reads and writes, held
  leases and their renewal (``JobRunStore``);
* :mod:`~jobrun.sql.statements.claims`: the claim, SQLite's and Postgres's
  (``JobRunStore.claim``, ``claim_batch``);
* :mod:`~jobrun.sql.statements.limits`: rate-limit buckets and concurrency slots;
* :mod:`~jobrun.sql.statements.operator`: changes by hand, health, pruning,
  retention and the workers' rows (``OperatorStore``);
* :mod:`~jobrun.sql.statements.schedules`: each schedule's progress (``ScheduleStore``);
* :mod:`~jobrun.sql.statements.browse`: the listing and the console's reads
  (``jobrun._core.operator.browse.BrowsableStore``);
* :mod:`~jobrun.sql.statements.worker`: what the worker reads and locks beside the port.

What they build on: :mod:`~jobrun.sql.statements.rules` (the SQL twins of
``jobrun._core.model.predicates``, each rule spelled once),
:mod:`~jobrun.sql.statements.clock` (the database's clock as stored instant text)
and :mod:`~jobrun.sql.statements.compiled` (compiled once per shape).

Values are bound parameters, never part of the statement, so each statement is
compiled once (``jobrun.sql.executor.Compiler``) and only its parameter list is
built per call; the store picks a statement, binds its values by the names given
here, and maps the rows. The pass's and the start's statements, health and the
resume's refill are compiled with the store (``RunStatements``,
``OperatorStatements``); the others, whose shape depends on the call or which
only some stores send, once per shape on first use (``Shapes``).
"""
