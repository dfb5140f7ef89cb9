"""The ``jobrun worker`` command."""
