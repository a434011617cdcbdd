"""The documented name of the interface check, ``python -m recbench.benchmarks.check_model`` and
``from recbench.benchmarks.check_model import check_model`` (:mod:`benchmarks.commands.check_model`)."""
import sys

from recbench.benchmarks.commands.check_model import ModelCheckError, check_model, main

__all__ = ["check_model", "ModelCheckError", "main"]

if __name__ == "__main__":
    sys.exit(main())
