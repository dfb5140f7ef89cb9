"""What an operator and a caller do to runs: start, cancel, resume, release, prune;
read runs, their activity, the workers, what a run is waiting for.
"""
