#!/usr/bin/env python3
"""Regenerate the sample outputs in docs/cli.md by running the verbs (tests/cli_samples.py says on what);
tests/test_cli_docs.py checks that the samples still have the structure the verbs print."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests import cli_samples  # noqa: E402

if __name__ == "__main__":
    with open(cli_samples.DOC) as handle:
        text = handle.read()
    new = text
    for name, make in cli_samples.SAMPLES.items():
        new = cli_samples.replace_block(new, name, make())
    if new != text:
        with open(cli_samples.DOC, "w") as handle:
            handle.write(new)
        print("docs/cli.md: samples updated")
