"""The documented name of the tuning command, ``python -m benchmarks.tune`` (:mod:`benchmarks.commands.tune`)."""
import sys

from recbench.benchmarks.commands.tune import main

if __name__ == "__main__":
    sys.exit(main())
