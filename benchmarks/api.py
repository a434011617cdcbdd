"""The documented name of the Python API, ``from recbench.benchmarks.api import run``
(:mod:`benchmarks.commands.api`)."""
from recbench.benchmarks.commands.api import (
    GridError,
    InteractionLog,
    JobsFailed,
    LogFormat,
    ModelCheckError,
    SplitSpec,
    check_model,
    run,
)

__all__ = ["run", "JobsFailed", "GridError", "check_model", "ModelCheckError", "InteractionLog", "LogFormat",
           "SplitSpec"]
