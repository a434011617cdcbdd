"""Helpers that several test modules use: where the staged real data lives, small synthetic datasets and attention
models, a left-padded history builder, a training crash at a chosen validation, scorers with fixed scores (a table,
or a product of fixed factors), models of a user's own in a package, a wait on a running command and a Dask cluster
on this machine. Test modules import them from here, never from one another; the shared fixtures are in
``conftest.py``."""
import os
import re
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from recbench.datasets.sequences import SequenceData
from recbench.models import model_class
from recbench.models.base import Recommender, ScoreFactors, gather_candidates

ROOT = Path(__file__).resolve().parents[1]
# The staged real data beside the checkout, or the folder $RECBENCH_DATA_DIR names (a worktree elsewhere).
SHARED_DATA = Path(os.environ.get("RECBENCH_DATA_DIR") or ROOT.parent / "shared" / "data")

requires_shared_data = pytest.mark.skipif(
    not SHARED_DATA.is_dir(), reason=f"real data folder {SHARED_DATA} is absent; set RECBENCH_DATA_DIR to the folder "
                                     f"of the dataset files (ml-1m_seq_full.txt.gz, beauty.txt.gz, ...) to run it")


def chain_data(n_users=300, n_items=150, follow=0.85, seed=0) -> SequenceData:
    """Sequences that mostly follow one fixed successor per item (a random permutation), else jump anywhere:
    the next item is predictable from the last one, which POP cannot exploit."""
    rng = np.random.default_rng(seed)
    successor = rng.permutation(n_items) + 1
    sequences = []
    for _ in range(n_users):
        sequence = [int(rng.integers(1, n_items + 1))]
        for _ in range(int(rng.integers(6, 25)) - 1):
            jump = rng.random() >= follow
            sequence.append(int(rng.integers(1, n_items + 1)) if jump else int(successor[sequence[-1] - 1]))
        sequences.append(sequence)
    return SequenceData.from_sequences("chain", sequences, n_items=n_items)


def repeat_data(n_users=50, n_items=40, seed=0) -> SequenceData:
    """Histories with repeated items and targets that were consumed before."""
    rng = np.random.default_rng(seed)
    return SequenceData.from_sequences("repeats", [rng.integers(1, n_items + 1, rng.integers(3, 30))
                                                   for _ in range(n_users)], n_items=n_items)


def histories(rows, width=12) -> torch.Tensor:
    """Left-padded (len(rows), width) matrix."""
    out = torch.zeros(len(rows), width, dtype=torch.long)
    for r, items in enumerate(rows):
        out[r, width - len(items):] = torch.tensor(items)
    return out


@dataclass
class _NoConfig:
    pass


def small(model: str, seed: int = 0, **changes):
    """A small attention model of the registry on 40 items, in eval mode."""
    torch.manual_seed(seed)
    cls = model_class(model)
    base = dict(max_len=12, hidden=16, heads=2, dropout=0.1, attention_dropout=0.1)
    return cls(10, 40, cls.Config(**{**base, **changes})).eval()


class FixedScorer(Recommender):
    """Scores every item with ``table[user, item]``; records every history it was shown."""

    name = "fixed"
    Config = _NoConfig

    def __init__(self, table: np.ndarray, history_length: int = 8):
        super().__init__(table.shape[0], table.shape[1] - 1, _NoConfig())
        self.table = torch.as_tensor(table, dtype=torch.float32)
        self._history_length = history_length
        self.seen_histories = []

    @property
    def history_length(self):
        return self._history_length

    def fit(self, train, validate, settings):
        return {}

    def score(self, users, histories, candidates):
        self.seen_histories.append(histories.clone())
        return gather_candidates(self.table[users], candidates)


class ProductScorer(FixedScorer):
    """score(u, i) = q_u · e_i + b_i from fixed factors, offered to the evaluator through ``score_factors``."""

    def __init__(self, queries: np.ndarray, items: np.ndarray, bias: np.ndarray | None = None):
        super().__init__(np.zeros((len(queries), len(items))))
        self.queries = torch.as_tensor(queries, dtype=torch.float32)
        self.items = torch.as_tensor(items, dtype=torch.float32)
        self.bias = None if bias is None else torch.as_tensor(bias, dtype=torch.float32)

    def score_factors(self, users, histories):
        return ScoreFactors(self.queries[users], self.items, self.bias)

    def score(self, users, histories, candidates):
        return gather_candidates(self.score_factors(users, histories).full(), candidates)


# Models of a user's own, written by tests into a package outside the checkout. The sound one is padding-proof
# (padding is masked); the other runs a GRU over the left padding too, so its scores change with its width.
OWN_MODEL = '''"""The mean embedding of a user's last items against every item's embedding, trained by softmax."""
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from recbench.models.base import NeuralRecommender, gather_candidates, require


@dataclass
class Config:
    hidden: int = 16
    window: int = 2

    def __post_init__(self):
        require(self, self.hidden >= 1, "hidden", "be >= 1")


class MyRec(NeuralRecommender):
    Config = Config

    def __init__(self, n_users, n_items, config):
        super().__init__(n_users, n_items, config)
        self.items = nn.Embedding(n_items + 1, config.hidden, padding_idx=0)

    @property
    def history_length(self):
        return self.config.window

    def query(self, histories):
        real = (histories > 0).float().unsqueeze(-1)
        return (self.items(histories) * real).sum(1) / real.sum(1).clamp(min=1)

    def training_examples(self, train):
        items = torch.from_numpy(train.items)
        first = torch.from_numpy(train.offsets[:-1]).repeat_interleave(torch.from_numpy(train.lengths))
        index = torch.arange(len(items))[:, None] + torch.arange(-self.config.window, 0)
        history = torch.where(index >= first[:, None], items[index.clamp(min=0)], 0)
        keep = torch.arange(len(items)) > first
        return {"history": history[keep], "target": items[keep]}

    def loss(self, batch, generator):
        return F.cross_entropy(self.query(batch["history"]) @ self.items.weight[1:].T, batch["target"] - 1)

    def score(self, users, histories, candidates):
        return gather_candidates(self.query(histories) @ self.items.weight.T, candidates)
'''

PADDING_SENSITIVE_MODEL = OWN_MODEL.replace(
    '''        self.items = nn.Embedding(n_items + 1, config.hidden, padding_idx=0)
''', '''        self.items = nn.Embedding(n_items + 1, config.hidden, padding_idx=0)
        self.gru = nn.GRU(config.hidden, config.hidden, batch_first=True)
''').replace(
    '''        real = (histories > 0).float().unsqueeze(-1)
        return (self.items(histories) * real).sum(1) / real.sum(1).clamp(min=1)
''', '''        return self.gru(self.items(histories))[0][:, -1]  # runs over the padding too
''')


# Its values beside it, as a user's package may give them (the model's defaults otherwise).
SMOKE_TOML = """[model]
hidden = 12           # our choice
[train]
lr = 1e-2             # our choice
[smoke.train]
max_epochs = 2        # smoke profile: seconds
"""


README_BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)
SAVED_AS = re.compile(r"save\s+this\s+as\s+`([^`]+)`:\s*$", re.I)


def interrupt_training_at_validation(monkeypatch, number: int) -> None:
    """Make a grid's training crash at its ``number``-th validation, after ``number - 1`` epochs have written
    their checkpoint, as a killed or failed run leaves it; ``monkeypatch.undo()`` ends the crashes."""
    from recbench.benchmarks.evaluator import Evaluator

    original, calls = Evaluator.evaluate, []

    def crash(self, model, split, *args, **kwargs):
        calls.append(split)
        if split == "valid" and calls.count("valid") == number:
            raise RuntimeError("simulated crash during training")
        return original(self, model, split, *args, **kwargs)

    monkeypatch.setattr(Evaluator, "evaluate", crash)


USER_PAGES = ("README.md", "benchmarks/EXTENDING.md", "benchmarks/GUIDE.md")  # README.md and the pages it links to


def readme_section(title: str) -> str:
    """The text of the section ``## title`` of README.md or of the first user's page it links to that has it."""
    text = next(text for page in USER_PAGES if f"\n## {title}\n" in (text := (ROOT / page).read_text()))
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def readme_blocks(title: str) -> list[tuple[str, str, str | None]]:
    """Every code block of the user's pages' section ``title`` (:func:`readme_section`) as (language, text, the path
    the sentence just before it says to save it as, or None)."""
    text, blocks = readme_section(title), []
    for block in README_BLOCK.finditer(text):
        before = text[:block.start()].rstrip("\n")
        target = SAVED_AS.search(before)
        saved = target.group(1) if target is not None and target.end() == len(before) else None
        blocks.append((*block.groups(), saved))
    return blocks


def write_package(root: Path, package: str, files: dict[str, str]) -> Path:
    """``root/package/`` with an empty ``__init__.py`` and ``files`` (name -> text); returns the package folder."""
    folder = root / package
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "__init__.py").write_text("")
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def wait_for(condition, process, seconds=120):
    """Poll ``condition`` until it holds, failing when ``process`` ends first or time runs out."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert process.poll() is None, "the run ended before the condition was met"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@contextmanager
def dask_cluster(env: dict, workers: int = 2):
    """A Dask scheduler and ``workers`` one-thread workers on 127.0.0.1, each its own process running this
    checkout (``env`` added to their environment); yields the scheduler's address."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    address = f"tcp://127.0.0.1:{port}"
    common = ["--no-dashboard", "--host", "127.0.0.1"]
    cluster = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--port", str(port),
                                 *common], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        cluster += [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1",
                                      *common], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    for _ in range(workers)]
        from dask.distributed import Client

        with Client(address, timeout="60s") as client:
            client.wait_for_workers(workers, timeout=60)
        yield address
    finally:
        for process in cluster:
            process.terminate()
        for process in cluster:
            process.wait(timeout=30)
