"""The pass engine: a job registry, one pass (``passes``) with its steps, map and limit
gate, what a pass's end writes (``outcomes``), and the drive that claims and runs passes.
"""
