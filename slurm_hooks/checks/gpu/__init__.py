"""The `gpu` family: one module per check group (inventory, memory, state, links, procs) and
their shared plumbing (common).
"""
