"""The pieces of ``jobrun.testing``: import them from there."""
