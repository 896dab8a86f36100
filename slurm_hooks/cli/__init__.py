"""The command line: argument parsing and rendering; the work is the library's (no library module
imports this package: tests/test_import_cycles.py).
"""
