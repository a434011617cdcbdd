"""The non-Transformer baselines (NCF, FPMC, GRU4Rec, GRU4Rec+, Caser, LSTM): what is their own.

Each model is trained once, briefly and on CPU, on a small synthetic dataset with strong sequential structure
(:func:`chain_data`: a fixed successor per item, plus Zipf popularity), then checked: it beats POP through the shared
evaluator; causal models' training outputs at step t equal scoring the prefix ending at t; history models read only
their window; every training draw comes from the trainer's generator; an interrupted run resumes to the identical
result; bad settings are refused in the one message shape. The interface every model shares (score shapes,
candidate scores, batching, left padding, the held-out items never reaching training, checkpoints) is checked for
every registered model by the battery of ``benchmarks.check_model`` (tests/test_check_model.py).
"""
import dataclasses

import numpy as np
import pytest
import torch

from recbench.benchmarks.evaluator import Evaluator
from recbench.benchmarks.trainer import Trainer, TrainRun, TrainSettings
from recbench.datasets.sequences import PAD, Histories, LeaveOneOutSplit, SequenceData
from recbench.models import model_class
from recbench.models.base import show
from recbench.models.caser import caser_windows
from recbench.models.recurrent import right_align, sequence_windows

BASELINES = ("ncf", "fpmc", "gru4rec", "gru4rec+", "caser", "lstm")
RECURRENT = ("gru4rec", "gru4rec+", "lstm")

# Small networks and short training: enough to learn the chain in a few seconds each on one CPU thread.
SMALL = {
    "ncf": (dict(factors=16, mlp_layers=(64, 32, 16)), dict(lr=5e-3, batch_size=2048, max_epochs=30)),
    "fpmc": (dict(hidden=32), dict(lr=1e-2, batch_size=512, max_epochs=15)),
    "gru4rec": (dict(hidden=32, max_len=30, session_batch=32),
                dict(optimizer="adagrad", lr=0.05, batch_size=1, max_epochs=15)),
    "gru4rec+": (dict(hidden=32, max_len=30, session_batch=32, n_sample=128),
                 dict(optimizer="adagrad", lr=0.05, batch_size=1, max_epochs=15)),
    "caser": (dict(hidden=32), dict(lr=1e-2, batch_size=512, max_epochs=15)),
    "lstm": (dict(hidden=32, max_len=30), dict(lr=1e-2, batch_size=32, max_epochs=15)),
}


# These networks are tiny: intra-op threads only add overhead, and on a shared CPU they spin against each other.
pytestmark = pytest.mark.usefixtures("one_thread")


def build(name: str, data: SequenceData, seed: int = 0, **changes):
    cls = model_class(name)
    torch.manual_seed(seed)
    return cls(data.n_users, data.n_items, cls.Config(**{**SMALL[name][0], **changes}))


def trainer(name: str, checkpoint=None, **changes) -> Trainer:
    """The shared trainer with ``name``'s small settings, seed 0, no progress bar."""
    return Trainer(TrainSettings(**{**SMALL[name][1], **changes}), TrainRun(seed=0, checkpoint=checkpoint,
                                                                            progress=False))


def chain_data(n_users: int = 300, n_items: int = 200, length: int = 20, follow: float = 0.85,
               seed: int = 0, name: str = "chain") -> SequenceData:
    """Each item has one successor (a fixed random permutation); a user starts at a popular item and then, at
    every step, moves to the successor with probability ``follow`` or jumps to an item drawn by Zipf popularity.
    So the next item is predictable from the last one, a user's items cluster along the chain (signal for
    collaborative filtering), and POP is a fair but weak baseline."""
    rng = np.random.default_rng(seed)
    popularity = rng.permutation(1.0 / np.arange(1, n_items + 1))
    popularity /= popularity.sum()
    successor = rng.permutation(n_items) + 1  # successor[i - 1] follows item i
    lengths = rng.integers(length - 5, length + 6, size=n_users)
    walks = np.zeros((n_users, lengths.max()), dtype=np.int64)
    walks[:, 0] = rng.choice(n_items, size=n_users, p=popularity) + 1
    for t in range(1, lengths.max()):
        jump = rng.choice(n_items, size=n_users, p=popularity) + 1
        walks[:, t] = np.where(rng.random(n_users) < follow, successor[walks[:, t - 1] - 1], jump)
    return SequenceData.from_sequences(name, [walk[:n] for walk, n in zip(walks, lengths)], n_items=n_items)


@pytest.fixture(scope="module")
def chain():
    return LeaveOneOutSplit(chain_data())


@pytest.fixture(scope="module")
def evaluator(chain):
    return Evaluator(chain, seed=0)


@pytest.fixture(scope="module")
def trained(chain):
    models = {}
    for name in BASELINES:
        model = build(name, chain.data)
        trainer(name).fit(model, chain.train(), None)
        model.eval()
        models[name] = model
    return models


@pytest.fixture(scope="module")
def scored_users(chain):
    view = chain.test()
    rows = np.arange(0, len(view), 7)  # 43 users, histories of every length
    return view, rows


def inputs(model, view, rows, width=None):
    width = width or max(model.history_length, 1)
    return torch.from_numpy(view.users[rows]), torch.from_numpy(view.padded(rows, width))


@pytest.mark.parametrize("name", BASELINES)
def test_beats_pop_on_the_test_split(name, chain, evaluator, trained):
    pop = model_class("pop")(chain.data.n_users, chain.n_items)
    pop.fit(chain.train())
    baseline = evaluator.evaluate(pop, "test", "full").metrics["NDCG@10"]
    ndcg = evaluator.evaluate(trained[name], "test", "full", name).metrics["NDCG@10"]
    assert ndcg > 1.25 * baseline, f"{name}: NDCG@10 {ndcg:.4f} vs POP {baseline:.4f}"


def test_pop_scores_count_training_interactions_only():
    """POP must not count validation and test items, or it would leak them into its ranking."""
    data = SequenceData.from_sequences("tiny", [[1, 2, 3, 4], [2, 3, 5]], n_items=6)
    pop = model_class("pop")(data.n_users, data.n_items)
    pop.fit(LeaveOneOutSplit(data).train())  # the training sequences [1, 2] and [2]
    scores = pop.score(torch.tensor([0, 1]), torch.zeros(2, 1, dtype=torch.long), None)
    assert scores.tolist() == [[0, 1, 2, 0, 0, 0, 0]] * 2  # items 3, 4, 5 are validation or test targets


@pytest.mark.parametrize("name", RECURRENT)
def test_training_outputs_at_step_t_equal_scoring_the_prefix(name, trained, chain):
    """Causality: the user vector a window trains at position t is the one scoring the history up to t, and
    items after t never change it."""
    model = trained[name]
    t = 4
    windows = torch.from_numpy(sequence_windows(chain.train(), model.config.max_len))
    sequences = windows[(windows != PAD).sum(1) > t + 1][:12, :-1]  # windows with real items past step t
    altered = sequences.clone()
    altered[:, t + 1:] = torch.where(altered[:, t + 1:] != PAD, altered[:, t + 1:] % model.n_items + 1, PAD)
    with torch.inference_mode():
        states = model.encode(sequences, None)
        torch.testing.assert_close(model.encode(altered, None)[:, :t + 1], states[:, :t + 1])
        prefix = torch.cat([torch.full((len(sequences), 20), PAD), sequences[:, :t + 1]], 1)  # left-padded
        scored = model.score(torch.zeros(len(sequences), dtype=torch.long), prefix, None)
        torch.testing.assert_close(scored, model.item_scores(states[:, t]), rtol=1e-5, atol=1e-5)


def test_history_models_read_only_their_window(trained, scored_users):
    """FPMC reads the last item, Caser the last L, NCF none: older items never change their scores."""
    view, rows = scored_users
    for name, reads in (("fpmc", 1), ("caser", trained["caser"].config.L), ("ncf", 0)):
        model = trained[name]
        users, histories = inputs(model, view, rows, width=12)
        older = histories.clone()
        older[:, :12 - reads] = torch.where(older[:, :12 - reads] != PAD, 1, PAD)
        with torch.inference_mode():
            torch.testing.assert_close(model.score(users, older, None), model.score(users, histories, None))


def tiny_histories(sequences) -> Histories:
    lengths = np.array([len(s) for s in sequences])
    offsets = np.r_[0, np.cumsum(lengths)]
    return Histories(np.concatenate(sequences).astype(np.int64), offsets, np.arange(len(sequences)))


def test_training_windows_predict_each_next_item_once_from_its_past():
    train = tiny_histories([np.arange(1, 12), np.array([20, 21]), np.array([30])])
    windows = sequence_windows(train, max_len=4)
    pairs = sorted((int(a), int(b)) for w in windows for a, b in zip(w[:-1], w[1:]) if b != PAD)
    assert pairs == [(i, i + 1) for i in range(1, 11)] + [(20, 21)]  # every next item once, after its predecessor
    assert all((w[np.flatnonzero(w == PAD)[0]:] == PAD).all() for w in windows if (w == PAD).any())  # right-padded

    users, recent, targets = caser_windows(train, L=3, T=2, pad_windows=True)
    for user, before, after in zip(users, recent, targets):
        sequence = list(train.items[train.offsets[user]:train.offsets[user + 1]])
        start = sequence.index(after[0])
        assert list(after) == sequence[start:start + 2]
        assert list(before) == [PAD] * max(0, 3 - start) + sequence[max(0, start - 3):start]
    assert len(users) == 10 + 1  # user 0: positions 0..9 start a window of 2 targets; user 1: one; user 2: none


def test_right_align_moves_left_padding_behind():
    left = torch.tensor([[0, 0, 5, 6], [1, 2, 3, 4], [0, 0, 0, 0]])
    right, lengths = right_align(left)
    assert right.tolist() == [[5, 6, 0, 0], [1, 2, 3, 4], [0, 0, 0, 0]]
    assert lengths.tolist() == [2, 4, 0]


@pytest.mark.parametrize("name", BASELINES)
def test_every_training_draw_comes_from_the_trainers_generator(name, chain):
    model = build(name, chain.data)  # with its default dropout, where it has one
    examples = model.training_examples(chain.train())
    batch = {key: value[:64] for key, value in examples.items()}
    model.train()
    losses = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)  # must not matter
        losses.append(model.loss(batch, torch.Generator().manual_seed(7)))
    assert torch.equal(losses[0], losses[1])
    assert not torch.equal(losses[0], model.loss(batch, torch.Generator().manual_seed(8)))


@pytest.mark.parametrize("name", BASELINES)
def test_interrupted_training_resumes_to_the_same_weights(name, tmp_path):
    split = LeaveOneOutSplit(chain_data(n_users=40, n_items=60, length=10, seed=3, name="tiny"))
    quick = dict(max_epochs=4, batch_size=64)
    reference = build(name, split.data)
    trainer(name, **quick).fit(reference, split.train(), None)

    checkpoint = tmp_path / "run.pt"
    calls = {"n": 0}

    def crash_at_third_validation(model):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return {"NDCG@10": 0.0}

    interrupted = build(name, split.data)
    with pytest.raises(KeyboardInterrupt):
        trainer(name, checkpoint=str(checkpoint), **quick).fit(interrupted, split.train(),
                                                               crash_at_third_validation)
    resumed = build(name, split.data, seed=99)  # a different init: everything must come from the checkpoint
    report = trainer(name, checkpoint=str(checkpoint), **quick).fit(resumed, split.train(), None)
    assert report.epochs_run == 4
    for (key, expected), actual in zip(reference.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(expected, actual), f"{name}: {key} differs after resuming"


BAD_SETTINGS = [  # (model, field, value, the message after "field=value must ")
    ("bprmf", "hidden", 0, "be >= 1"), ("bprmf", "reg", -0.1, "be >= 0"), ("bprmf", "init_std", 0.0, "be > 0"),
    ("bprmf", "sample_alpha", -1.0, "be >= 0"),
    ("fpmc", "hidden", 0, "be >= 1"), ("fpmc", "reg", -1.0, "be >= 0"), ("fpmc", "init_std", -0.5, "be > 0"),
    ("ncf", "factors", 0, "be >= 1"), ("ncf", "negatives", 0, "be >= 1"), ("ncf", "init_std", 0.0, "be > 0"),
    ("ncf", "mlp_layers", (33, 16), "start with an even width"), ("ncf", "mlp_layers", (64,), "list at least two"),
    ("ncf", "mlp_layers", (64, 0), "list at least two"), ("ncf", "towers", "both", "be one of"),
    ("gru4rec", "hidden", 0, "be >= 1"), ("gru4rec", "layers", 0, "be >= 1"),
    ("gru4rec", "session_batch", 0, "be >= 1"), ("gru4rec", "max_len", 0, "be >= 1"),
    ("gru4rec", "embedding", -1, "be >= 0"),
    ("gru4rec", "dropout_hidden", 1.0, "be in [0, 1)"), ("gru4rec", "dropout_embed", -0.1, "be in [0, 1)"),
    ("gru4rec", "final_act", "relu", "be one of linear, tanh"),
    ("gru4rec", "loss", "cross-entropy", "be one of top1, bpr"),
    ("gru4rec", "training", "parallel", "be one of session-parallel, windows"),
    ("gru4rec+", "loss", "top1", "be one of bpr-max, top1-max"), ("gru4rec+", "n_sample", -1, "be >= 0"),
    ("gru4rec+", "sample_alpha", -0.5, "be >= 0"), ("gru4rec+", "bpreg", -1.0, "be >= 0"),
    ("gru4rec+", "hidden", 0, "be >= 1"),
    ("caser", "L", 0, "be >= 1"), ("caser", "T", 0, "be >= 1"), ("caser", "n_h", 0, "be >= 1"),
    ("caser", "n_v", 0, "be >= 1"), ("caser", "negatives", 0, "be >= 1"), ("caser", "hidden", 0, "be >= 1"),
    ("caser", "dropout", 1.0, "be in [0, 1)"),
    ("lstm", "hidden", 0, "be >= 1"), ("lstm", "layers", 0, "be >= 1"), ("lstm", "max_len", 0, "be >= 1"),
    ("lstm", "dropout", -0.2, "be in [0, 1)"),
    ("lstm-rel", "negatives", 0, "be >= 1"), ("lstm-rel", "max_len", 0, "be >= 1"),
]


@pytest.mark.parametrize("name, field, value, rule", BAD_SETTINGS)
def test_bad_settings_are_refused_by_the_config_with_the_one_message_shape(name, field, value, rule):
    with pytest.raises(ValueError) as error:
        model_class(name).Config(**{field: value})
    assert str(error.value).startswith(f"{field}={show(value)} must {rule}")


def test_gru4rec_constrained_embedding_excludes_an_embedding_size():
    with pytest.raises(ValueError, match=r"^constrained_embedding=true must be false when embedding > 0"):
        model_class("gru4rec").Config(embedding=32, constrained_embedding=True)


def test_every_baseline_config_checks_its_defaults_and_pop_has_none():
    for name in ("bprmf", "fpmc", "ncf", "gru4rec", "gru4rec+", "caser", "lstm", "lstm-rel", "pop"):
        model_class(name).Config()  # the defaults are valid
    assert dataclasses.fields(model_class("pop").Config) == ()
