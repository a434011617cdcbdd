"""The CUDA path checked on a machine with a GPU, in minutes, from a checkout:

    python -m benchmarks.gpu_check            # any other argument goes to pytest, e.g. -x

It runs the suite's CUDA tests (``python -m pytest -m cuda``: every registered model scores on the GPU as on the CPU
and takes a bf16 training step there, a small model trains to a useful result, the evaluator gives the CPU's counts,
a CUDA checkpoint resumes on the CPU) after a first line naming the device, and exits with pytest's status. Where
torch sees no CUDA device it says so in one line and runs nothing. An installed suite without its ``tests/`` folder
is told to run it from a checkout. The options of the timed rehearsal of a GPU machine (``--data-dir``, ``--out``,
...), which is the lab's, are refused in one line that says where it is.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def pytest_command(extra: list[str]) -> list[str]:
    """The CUDA tests of the checkout's ``tests/`` (CUDA cases live beside their CPU ones too), with ``extra``."""
    return [sys.executable, "-m", "pytest", "-m", "cuda", "-p", "no:cacheprovider", "-rs", *extra, str(ROOT / "tests")]


# The options of the rehearsal this command once was, which a user may still type.
REHEARSAL_OPTIONS = ("--data-dir", "--out", "--minutes", "--speed-batches", "--skip", "--train-dataset")


def main(argv: list[str] | None = None) -> int:
    extra = sys.argv[1:] if argv is None else list(argv)
    rehearsal = [word for word in extra if word.split("=")[0] in REHEARSAL_OPTIONS]
    if rehearsal:
        print(f"{' '.join(rehearsal)}: this command runs the CUDA tests and takes pytest's options only; the timed "
              f"rehearsal of a GPU machine is python -m benchmarks.experiments.gpu_check --data-dir DATA --out DIR, "
              f"from the checkout", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(f"torch {torch.__version__} sees no CUDA device, so there is no CUDA path to check here; run this on "
              f"the GPU machine (with a CUDA build of torch)", file=sys.stderr)
        return 1
    if not (ROOT / "tests" / "test_cuda.py").is_file():
        print(f"{ROOT / 'tests'} is absent: the CUDA tests run from a checkout of the suite (pip install -e .)",
              file=sys.stderr)
        return 1
    print(f"checking the CUDA path on {torch.cuda.get_device_name()} (torch {torch.__version__}, CUDA "
          f"{torch.version.cuda}): python -m pytest -m cuda", flush=True)
    return subprocess.run(pytest_command(extra), cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
