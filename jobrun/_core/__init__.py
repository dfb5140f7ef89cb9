"""The pure core: run, pass and step rules, queue-safety, backoff and formats.

Nothing here touches a database or the network, and nothing reads a real source
on its own (the clock, entropy, ids, ``/proc``, the process id): the public
entry points (``jobrun._api``) choose them once and hand them in as a
:class:`~jobrun._core.sources.Sources`. import-linter holds this line, indirect
imports included.
"""
