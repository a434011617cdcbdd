"""The commands a user runs, built on the harness and the reports: the options and the end of every grid command
(``cli``), the studies, tuning, the interface check of a model and the Python API. Nothing in the suite imports
them; each is also reachable under its documented name, a launcher one folder up (``python -m benchmarks.tune``,
``from recbench.benchmarks.api import run``)."""
