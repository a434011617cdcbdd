"""The documented name of the GPU check, ``python -m benchmarks.gpu_check`` (:mod:`benchmarks.commands.gpu_check`)."""
import sys

from recbench.benchmarks.commands.gpu_check import main

if __name__ == "__main__":
    sys.exit(main())
