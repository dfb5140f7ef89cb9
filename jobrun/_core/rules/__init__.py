"""The run's rules, pure: state transitions of claim, pass end, takeover and operator
actions; retry backoff; fair claim turns; job versions; schedules.
"""
