"""The pure core: run, pass and step rules, queue-safety, backoff and formats.

Nothing here touches a database or the network, and nothing reads the clock or a
random source on its own: both are passed in. import-linter holds this line.
"""
