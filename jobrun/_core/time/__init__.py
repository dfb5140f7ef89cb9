"""Clocks: the clock handed in, a clock aligned to the database's, and the watch
that notices a step of the wall clock. Above the records only.
"""
