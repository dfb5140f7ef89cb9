"""The lease: renewing it (``renewal``), fencing a write with it, the holder a lease
names and the proof that its holder is dead, and the releases a failed write owes.
"""
