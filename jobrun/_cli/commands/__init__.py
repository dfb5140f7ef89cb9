"""The ``jobrun`` commands, one module per command group.

Each module registers its commands on the group (:data:`jobrun._cli.app.cli`)
when imported, and the group imports a module only when one of its commands
runs, so this package imports none of them. The parts they share (connecting,
rendering, arguments) stay beside it in ``jobrun/_cli/``.
"""
