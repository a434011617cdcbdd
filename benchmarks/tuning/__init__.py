"""Tuning (``python -m benchmarks.tune``): what a study searches (``space``) and how its trials run as jobs of the
run layer (``study``)."""
