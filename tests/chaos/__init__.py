"""The chaos runner's machinery (issue 21): faults injected into real driver processes.

``stage`` runs one scenario (a database, a few runs, a fleet of
``tests/processes/chaos_child.py`` drivers, one fault) and hands the step
bodies' log to ``referee``; ``faults`` and ``cluster`` hold the faults and the
list of scenarios. ``__main__.py`` (``python -m tests.chaos``, ``make chaos``) runs them
and prints the table; ``tests/processes/test_chaos.py`` runs the quick set in CI.
"""
