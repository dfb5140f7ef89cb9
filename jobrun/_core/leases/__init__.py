"""The lease: claiming a run and taking it over (``claims``), renewing the lease
(``renewal``), fencing a write with it, the holder a lease names and the proof
that its holder is dead, and the releases a failed write owes.
"""
