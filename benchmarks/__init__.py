"""The harness: jobs, the trainer, the evaluator, the result store and the studies.

Importing it (before torch loads MKL, as every entry point here does) asks MKL for reproducible float sums:
without ``MKL_CBWR`` they follow the memory alignment of their inputs, so two identical CPU runs could end in
different last digits (``tests/test_default_run.py``). A value the user set is kept."""
import os

os.environ.setdefault("MKL_CBWR", "AUTO")
