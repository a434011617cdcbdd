"""One-off experiments that measure the suite (speed, reference numbers, evidence for closing notes).

They use the harness (grid, trainer, evaluator) like any caller and are never imported by it, so the harness
reads apart from them. Each one prints its figures and stores them as JSON under ``results/reference/``.
"""
