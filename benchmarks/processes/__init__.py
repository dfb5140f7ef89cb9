"""The child processes and apps scenarios start (drivers, workers, other systems, PgBouncer)."""
