"""The run's rules, pure: state transitions of pass end and operator actions;
retry backoff; fair claim turns; job versions; schedules.
"""
