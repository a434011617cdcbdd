"""The non-Transformer baselines against their authors' code: each official detail implemented under
``--profile paper`` is checked against a direct transcription of that code's equations (numpy, on random inputs),
or against a small case worked out by hand. Sources: hidasib/GRU4Rec (gru4rec.py, 2018 version),
graytowne/caser_pytorch (interactions.py, caser.py), hexiangnan/neural_collaborative_filtering (NeuMF.py)."""
import math

import numpy as np
import pytest
import torch

from recbench.benchmarks.optim import GRU4RecAdagrad
from recbench.datasets.sequences import PAD, Histories
from recbench.models.caser import Caser, CaserConfig, caser_windows
from recbench.models.gru4rec import GRU4Rec, GRU4RecConfig, ranking_loss, session_parallel_schedule
from recbench.models.gru4rec_plus import GRU4RecPlus, GRU4RecPlusConfig
from recbench.models.ncf import NCF, NCFConfig


def histories(sequences) -> Histories:
    lengths = np.array([len(s) for s in sequences])
    return Histories(np.concatenate(sequences).astype(np.int64), np.r_[0, np.cumsum(lengths)],
                     np.arange(len(sequences)))


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


# ------------------------------------------------------------------------------------------------ GRU4Rec
def test_gru_step_equals_the_codes_equations():
    """GRU4Rec.model(): vec = Wx[X] + Bh; rz = σ(vec[:, h:] + H·Wrz); ĥ = tanh((H ⊙ r)·Wh + vec[:, :h]);
    h = (1 − z) H + z ĥ, for a 1-of-N input, transcribed in numpy."""
    torch.manual_seed(0)
    d = 8
    model = GRU4Rec(5, 20, GRU4RecConfig(hidden=d, dropout_hidden=0.0))
    with torch.no_grad():
        model.gate_bias.normal_()
    items = torch.tensor([3, 7, 7, 19])
    state = torch.randn(4, d)
    new = model.step(items, [state], None)[0].detach().numpy()

    Wx, Bh = model.input_gates.weight.detach().numpy(), model.gate_bias[0].detach().numpy()
    Wrz, Wh = model.grus[0].recurrent_gates.detach().numpy(), model.grus[0].recurrent_candidate.detach().numpy()
    H = state.numpy()
    vec = Wx[items.numpy()] + Bh
    rz = sigmoid(vec[:, d:] + H @ Wrz)
    h = np.tanh((H * rz[:, :d]) @ Wh + vec[:, :d])
    z = rz[:, d:]
    np.testing.assert_allclose(new, (1.0 - z) * H + z * h, rtol=1e-5, atol=1e-6)


def test_gru4rec_initialisation_follows_the_code():
    """init_matrix: uniform in ±√(6 / (rows + cols)) per (fan_in, d) block; biases zero."""
    torch.manual_seed(0)
    n_items, d = 400, 16
    model = GRU4Rec(3, n_items, GRU4RecConfig(hidden=d))
    for weight, limit in ((model.input_gates.weight, math.sqrt(6 / (n_items + d))),
                          (model.grus[0].recurrent_candidate, math.sqrt(6 / (2 * d))),
                          (model.output.weight, math.sqrt(6 / (n_items + 1 + d)))):
        assert weight.abs().max() <= limit and weight.abs().max() > 0.9 * limit
    assert not model.gate_bias.any() and not model.output_bias.any()


def codes_softmax_neg(X):
    hm = 1.0 - np.eye(*X.shape)
    X = X * hm
    e_x = np.exp(X - X.max(axis=1, keepdims=True)) * hm
    return e_x / e_x.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("kind", ["top1", "bpr", "bpr-max", "top1-max"])
def test_ranking_losses_equal_the_codes_formulas(kind):
    """The code's loss on yhat (M rows, M + n_sample columns, the diagonal the targets), per row. TOP1 and BPR
    include the diagonal's constant (0.5 and log 2 over C), which carries no gradient."""
    rng = np.random.default_rng(0)
    M, C, bpreg = 6, 10, 0.7
    yhat = rng.normal(size=(M, C))
    diag = yhat[np.arange(M), np.arange(M)][:, None]
    if kind == "top1":
        expected = np.mean(sigmoid(-diag + yhat) + sigmoid(yhat ** 2), axis=1) - sigmoid(diag[:, 0] ** 2) / C
    elif kind == "bpr":
        expected = np.mean(-np.log(sigmoid(diag - yhat)), axis=1)
    elif kind == "bpr-max":
        s = codes_softmax_neg(yhat)
        expected = -np.log(np.sum(sigmoid(diag - yhat) * s, axis=1) + 1e-24) + bpreg * np.sum(yhat ** 2 * s, axis=1)
    else:
        s = codes_softmax_neg(yhat)
        expected = np.sum(s * (sigmoid(-diag + yhat) + sigmoid(yhat ** 2)), axis=1)
    valid = ~torch.eye(M, C, dtype=torch.bool)
    ours = ranking_loss(kind, torch.tensor(diag[:, 0]), torch.tensor(yhat), valid, bpreg).numpy()
    constant = {"top1": 0.5 / C, "bpr": math.log(2) / C}.get(kind, 0.0)
    np.testing.assert_allclose(ours + constant, expected, rtol=1e-5)


def test_session_parallel_schedule_by_hand():
    """Lanes take the next session when theirs ends (lowest lane first on ties); a session of n items is n - 1
    steps; a lane's state is reset when a session starts; the epoch ends when fewer than min_active lanes run."""
    train = histories([np.array([1, 2, 3]), np.array([4, 5]), np.array([6, 7, 8, 9]), np.array([10])])
    full = session_parallel_schedule(train, lanes=2, min_active=1)
    # lane 0: session 0 at steps 0-1, then nothing; lane 1: session 1 at step 0, session 2 at steps 1-3.
    assert full["inputs"].tolist() == [[1, 4], [2, 6], [PAD, 7], [PAD, 8]]
    assert full["targets"].tolist() == [[2, 5], [3, 7], [PAD, 8], [PAD, 9]]
    assert full["starts"].tolist() == [[True, True], [False, True], [False, False], [False, False]]
    two_lanes = session_parallel_schedule(train, lanes=2, min_active=2)  # GRU4Rec without additional samples
    assert two_lanes["inputs"].tolist() == [[1, 4], [2, 6]]


def small_gru4rec(**changes):
    torch.manual_seed(0)
    return GRU4Rec(4, 30, GRU4RecConfig(hidden=8, session_batch=3, dropout_hidden=0.0, **changes))


def test_session_parallel_loss_carries_the_state_and_scales_short_steps():
    """Two steps in one batch give the mean of the same two steps in successive batches (the lanes' state runs
    on, without gradient across batches); a step with M of B lanes active weighs M / B."""
    rng = np.random.default_rng(0)
    train = histories([rng.integers(1, 31, size=n) for n in (6, 4, 5, 3)])
    model = small_gru4rec()
    rows = {k: torch.from_numpy(v) for k, v in session_parallel_schedule(train, 3, 2).items()}
    generator = torch.Generator()
    together = model.loss({k: v[:4] for k, v in rows.items()}, generator)
    apart = [model.loss({k: v[i:i + 1] for k, v in rows.items()}, generator) for i in range(4)]
    torch.testing.assert_close(together, torch.stack(apart).mean())

    # by hand: two sessions on three lanes, so one lane idles; the step's mean over its M = 2 lanes weighs 2/3
    two = {k: torch.from_numpy(v) for k, v in
           session_parallel_schedule(histories([np.array([1, 2, 3]), np.array([4, 5, 6])]), 3, 2).items()}
    assert two["targets"][0].tolist() == [2, 5, PAD]
    model.lane_state = None
    h = model.step(two["inputs"][0], model.zero_state(3, torch.device("cpu")), None)[-1][:2]
    scores = torch.tanh(model.item_scores(h, two["targets"][0][:2]))
    expected = ranking_loss("top1", scores.diagonal(), scores, ~torch.eye(2, dtype=torch.bool)).mean() * 2 / 3
    torch.testing.assert_close(model.loss({k: v[:1] for k, v in two.items()}, generator), expected)


def test_gru4rec_plus_draws_its_additional_samples_by_support_power():
    train = histories([np.array([1, 1, 1, 1, 2, 3, 1, 1]), np.array([2, 2, 4])])
    torch.manual_seed(0)
    model = GRU4RecPlus(2, 5, GRU4RecPlusConfig(hidden=4, n_sample=20000, sample_alpha=0.5, session_batch=2))
    model.training_examples(train)
    drawn = model.extra_negatives(torch.Generator().manual_seed(0))
    counts = np.bincount(drawn.numpy(), minlength=6) / len(drawn)
    support = np.array([0, 6, 3, 1, 1, 0.0]) ** 0.5
    np.testing.assert_allclose(counts, support / support.sum(), atol=0.01)
    assert counts[5] == 0 and counts[0] == 0  # never-seen items and padding


def test_adagrad_step_equals_the_codes_update():
    """RMSprop(adapt='adagrad'): acc += g²; g / √(acc + 1e-6); p ← p (1 − lr λ) − lr g_scaled."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(5, 3))
    start = p.detach().clone().numpy()
    grads = [torch.randn(5, 3) for _ in range(3)]
    grads[1][2] = 0.0  # a row the step did not touch
    optimizer = GRU4RecAdagrad([p], lr=0.1, weight_decay=0.01)
    acc, expected = np.zeros((5, 3)), start.copy()
    for g in grads:
        p.grad = g.clone()
        optimizer.step()
        acc = acc + g.numpy() ** 2
        expected = expected * (1 - 0.1 * 0.01) - 0.1 * g.numpy() / np.sqrt(acc + 1e-6)
    np.testing.assert_allclose(p.detach().numpy(), expected, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------ Caser
def ports_windows(sequence, L, T):
    """interactions.py's _sliding_window over one user's items with window L + T, as (inputs, targets)."""
    window = L + T
    if len(sequence) - window >= 0:
        rows = [sequence[i - window:i] for i in range(len(sequence), 0, -1) if i - window >= 0]
    else:
        rows = [np.pad(sequence, (window - len(sequence), 0), "constant")]
    return sorted((tuple(r[:L]), tuple(r[L:])) for r in rows)


@pytest.mark.parametrize("lengths", [(11, 8, 7, 3), (20,), (2, 1)])
def test_caser_windows_equal_the_ports(lengths):
    rng = np.random.default_rng(1)
    sequences = [rng.choice(np.arange(1, 50), size=n, replace=False) for n in lengths]
    users, inputs, targets = caser_windows(histories(sequences), L=5, T=3, pad_windows=False)
    for user, sequence in enumerate(sequences):
        ours = sorted((tuple(i), tuple(t)) for i, t in zip(inputs[users == user], targets[users == user]))
        assert ours == ports_windows(sequence, 5, 3)


def test_caser_pad_windows_make_every_item_a_first_target():
    sequence = np.arange(1, 10)
    users, inputs, targets = caser_windows(histories([sequence]), L=3, T=2, pad_windows=True)
    assert targets[:, 0].tolist() == list(range(1, 9))
    assert inputs[0].tolist() == [PAD, PAD, PAD] and inputs[1].tolist() == [PAD, PAD, 1]
    assert inputs[-1].tolist() == [5, 6, 7]


def test_caser_initialisation_follows_the_port():
    """P, Q ~ N(0, 1/d), W2 ~ N(0, 1/(2d)) (the port divides by W2.embedding_dim = 2d), b2 = 0."""
    torch.manual_seed(0)
    d = 16
    model = Caser(3000, 3000, CaserConfig(hidden=d))
    assert abs(model.item_embedding.weight.std().item() - 1 / d) < 0.1 / d
    assert abs(model.user_embedding.weight.std().item() - 1 / d) < 0.1 / d
    assert abs(model.output.weight.std().item() - 1 / (2 * d)) < 0.1 / (2 * d)
    assert not model.output_bias.any()


# ------------------------------------------------------------------------------------------------ NCF
def test_ncf_mlp_follows_the_codes_layer_convention():
    """layers=[64, 32, 16, 8]: embeddings of 32 each, Dense layers 64 → 32 → 16 → 8 (the first width is the
    concatenation, not a layer); h over [φ^GMF (factors); φ^MLP (8)] with a bias."""
    model = NCF(10, 20, NCFConfig(factors=8, mlp_layers=(64, 32, 16, 8)))
    assert model.mlp_user.embedding_dim == 32 and model.gmf_user.embedding_dim == 8
    assert (model.first_user.in_features, model.first_user.out_features) == (32, 32)
    assert [(layer.in_features, layer.out_features) for layer in model.tower] == [(32, 16), (16, 8)]
    assert model.predict.weight.shape == (1, 16) and model.predict.bias is not None


def test_ncf_logits_equal_the_keras_graph():
    """NeuMF.get_model: σ(h·[p_G ⊙ q_G; MLP([p_M; q_M])] + b) with ReLU Dense layers, transcribed in numpy."""
    torch.manual_seed(0)
    model = NCF(6, 9, NCFConfig(factors=4, mlp_layers=(8, 6, 3)))
    with torch.no_grad():
        model.predict.bias.fill_(0.3)
    users, items = torch.tensor([0, 5, 2]), torch.tensor([[1, 9], [4, 4], [7, 2]])
    ours = model.logits(users, items).detach().numpy()
    w = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    relu = lambda x: np.maximum(x, 0)  # noqa: E731
    for b in range(3):
        for c in range(2):
            u, i = users[b].item(), items[b, c].item()
            mf = w["gmf_user.weight"][u] * w["gmf_item.weight"][i]
            x = np.concatenate([w["mlp_user.weight"][u], w["mlp_item.weight"][i]])
            W1 = np.concatenate([w["first_user.weight"], w["first_item.weight"]], 1)
            x = relu(W1 @ x + w["first_user.bias"])
            x = relu(w["tower.0.weight"] @ x + w["tower.0.bias"])
            logit = w["predict.weight"][0] @ np.concatenate([mf, x]) + w["predict.bias"][0]
            assert ours[b, c] == pytest.approx(logit, rel=1e-5, abs=1e-6)


def test_ncf_instances_mix_positives_and_negatives_like_the_code():
    """get_train_instances: each observed (u, i) then num_neg (u, j) rows; negatives are drawn per batch, never
    an item of the user's training sequence."""
    train = histories([np.array([1, 2, 3]), np.array([4, 5])])
    model = NCF(2, 30, NCFConfig(factors=4, mlp_layers=(8, 4), negatives=3))
    rows = model.training_examples(train)
    assert rows["users"].tolist() == [0] * 12 + [1] * 8
    assert rows["items"].tolist()[:8] == [1, PAD, PAD, PAD, 2, PAD, PAD, PAD]
    drawn = []
    original = model.logits
    model.logits = lambda users, items: drawn.append(items) or original(users, items)
    model.loss(rows, torch.Generator().manual_seed(0))
    items = drawn[0][:, 0]
    negatives = rows["items"] == PAD
    assert torch.equal(items[~negatives], rows["items"][~negatives])
    assert not torch.isin(items[negatives][:9], torch.tensor([1, 2, 3])).any()
    assert not torch.isin(items[negatives][9:], torch.tensor([4, 5])).any()


def test_ncf_from_towers_starts_as_the_alpha_mix_of_gmf_and_mlp():
    """load_pretrain_model: embeddings and layers copied, h = [α h_GMF; (1 − α) h_MLP], b = α b_GMF + (1 − α) b_MLP,
    so NeuMF's first logits are α·GMF's + (1 − α)·MLP's."""
    torch.manual_seed(0)
    gmf = NCF(5, 12, NCFConfig(factors=4, mlp_layers=(8, 4), towers="gmf"))
    mlp = NCF(5, 12, NCFConfig(factors=4, mlp_layers=(8, 4), towers="mlp"))
    with torch.no_grad():
        gmf.predict.bias.fill_(0.2)
        mlp.predict.bias.fill_(-0.6)
    neumf = NCF.from_towers(gmf, mlp, alpha=0.5)
    users, items = torch.tensor([0, 3, 4]), torch.tensor([[1, 2, 12]] * 3)
    with torch.no_grad():
        expected = 0.5 * gmf.logits(users, items) + 0.5 * mlp.logits(users, items)
        torch.testing.assert_close(neumf.logits(users, items), expected)
        torch.testing.assert_close(neumf.score(users, None, None).gather(1, items), expected)


def test_in_batch_negatives_never_reach_an_item_that_is_no_target():
    """Issue 13's mechanism: GRU4Rec's negatives are the step's other targets, so an item that is no target of a
    step gets no gradient from it and its score is never pushed down (rare items drift up the full ranking);
    GRU4Rec+'s additional samples reach such items."""
    train = histories([np.array([1, 2, 3, 4]), np.array([5, 6, 7, 8]), np.array([2, 6, 3, 7])])
    gru = small_gru4rec()
    plus = GRU4RecPlus(3, 30, GRU4RecPlusConfig(hidden=8, session_batch=3, n_sample=500, sample_alpha=0.0))
    for model in (gru, plus):
        rows = model.training_examples(train)  # GRU4Rec+ samples from the items seen here: 1..8
        model.loss({k: v[:1] for k, v in rows.items()}, torch.Generator().manual_seed(0)).backward()
        touched = model.output.weight.grad.abs().sum(1) > 0
        assert touched[rows["targets"][0]].all()
        others = torch.ones(31, dtype=torch.bool)
        others[rows["targets"][0]] = False
        others[0] = False
        if model is gru:
            assert not touched[others].any()
        else:
            assert touched[others].any() and not touched[9:].any()  # seen non-targets reached, unseen items not
