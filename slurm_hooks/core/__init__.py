"""Plumbing every mode shares: configuration, the check runner and its deadline, process isolation,
site checks (checks.d), crash-safe files, bounded locks, logs, value classes, the RunReport's formats.
"""
