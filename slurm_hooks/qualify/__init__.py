"""Qualification: active diagnostics (DCGM, nvbandwidth, nccl-tests, perftest) that prove a node good
before it returns to service (docs/qualify.md).

One module per tool parses that tool's printed output (pure `str -> report` functions, tested
against real outputs in tests/captures/diag/); `tools` runs a tool bounded, `levels` says which
tools run with which arguments and judges the reports against the [qualify] expectations, `flow`
runs a level on this node and keeps its record.
"""


class ParseError(ValueError):
    """A tool's output is not what that tool prints: the test fails with the tail of the output."""
