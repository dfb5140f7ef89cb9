"""The operator commands (db, runs, show, watch, start, cancel, resume, release, prune)."""
