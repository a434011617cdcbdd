"""The documented name of the studies' command, ``python -m benchmarks.studies``
(:mod:`benchmarks.commands.studies`)."""
import sys

from recbench.benchmarks.commands.studies import main

if __name__ == "__main__":
    sys.exit(main())
