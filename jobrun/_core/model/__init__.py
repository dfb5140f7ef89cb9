"""The records a run is made of and their stored encodings: rows, patches, the operator's
view of a run, formats, names, payload safety, refusals of bad input. The bottom wing:
it imports nothing of the core above it.
"""
