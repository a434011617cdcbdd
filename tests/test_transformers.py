"""The shared Transformer encoder and SASRec / SASRec-CE: the packed encoder against the plain equations, SASRec's
official block against a transcription of the authors' TF code, ablation switches, causality, padding, batching,
windows, attention maps, and learning a strong item-transition chain better than POP."""
import dataclasses
import math
import re

import numpy as np
import pytest
import torch

import recbench.models.bert4rec as bert4rec_module
import recbench.models.sasrec as sasrec_module
import recbench.models.transformer_fast as transformer_fast
from recbench.benchmarks.evaluator import Evaluator
from recbench.benchmarks.trainer import Trainer, TrainRun, TrainSettings
from recbench.datasets.sequences import Histories, LeaveOneOutSplit, SequenceData
from recbench.models.pop import Pop
from recbench.models.sasrec import SASRec, SASRecCE, SASRecConfig
from recbench.models.transformer import EncoderConfig, SequenceEncoder, sliding_windows, window_matrix
from recbench.models.transformer_fast import PackedSequenceEncoder, softmax_cross_entropy
from tests.helpers import chain_data, histories, small

pytestmark = pytest.mark.usefixtures("one_thread")


HISTORIES = histories([[3, 7, 1, 9, 4], [5, 2, 8, 2, 6, 11, 30, 12, 17, 21, 33], [40]])
USERS = torch.arange(3)


def hidden_states(model, items: torch.Tensor) -> torch.Tensor:
    """The encoder's (B, T, d) last-layer states, zero at padding (the encoder returns them packed)."""
    packed, _ = model.encoder(items)
    return torch.zeros(*items.shape, packed.shape[-1]).index_put((items != 0,), packed)


def n_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------------------------ ablation switches
@pytest.mark.parametrize("model", ["sasrec", "bert4rec"])
@pytest.mark.parametrize("switch", ["use_position", "use_ffn", "use_layernorm"])
def test_switch_removes_parameters_and_changes_outputs(model, switch):
    default, ablated = small(model), small(model, **{switch: False})
    assert n_parameters(ablated) < n_parameters(default)
    kept = {k: v for k, v in default.state_dict().items() if k in ablated.state_dict()}
    ablated.load_state_dict(kept)  # every remaining weight identical: only the component differs
    assert not torch.allclose(default.score(USERS, HISTORIES, None), ablated.score(USERS, HISTORIES, None))


@pytest.mark.parametrize("model", ["sasrec", "bert4rec"])
@pytest.mark.parametrize("changes", [{"use_residual": False}, {"heads": 4}, {"heads": 1}])
def test_parameter_free_switches_change_outputs(model, changes):
    default, variant = small(model), small(model, **changes)
    assert n_parameters(variant) == n_parameters(default)
    variant.load_state_dict(default.state_dict())
    assert not torch.allclose(default.score(USERS, HISTORIES, None), variant.score(USERS, HISTORIES, None))


@pytest.mark.parametrize("model", ["sasrec", "bert4rec"])
def test_layers_switch_adds_blocks(model):
    one, three = small(model, layers=1), small(model, layers=3)
    assert len(one.encoder.blocks) == 1 and len(three.encoder.blocks) == 3
    assert n_parameters(three) > n_parameters(small(model)) > n_parameters(one)


@pytest.mark.parametrize("model", ["sasrec", "bert4rec"])
def test_without_dropout_training_outputs_are_deterministic(model):
    def twice(m):
        m.train()
        return m.score(USERS, HISTORIES, None), m.score(USERS, HISTORIES, None)

    first, second = twice(small(model))
    assert not torch.allclose(first, second)  # dropout active
    first, second = twice(small(model, dropout=0.0, attention_dropout=0.0))
    assert torch.allclose(first, second)


def test_sasrec_is_causal_relu_with_its_official_block_and_bert4rec_post_ln_gelu():
    sasrec, bert = small("sasrec").encoder.config, small("bert4rec").encoder.config
    assert sasrec.causal and sasrec.block == "sasrec" and sasrec.activation == "relu" and sasrec.ffn_inner == 16
    assert small("sasrec", block="pre-ln").encoder.config.block == "pre-ln"
    assert not bert.causal and bert.block == "post-ln" and bert.activation == "gelu" and bert.ffn_inner == 64


def test_init_is_truncated_normal_with_std_002():
    weight = small("bert4rec", hidden=64).encoder.blocks[0].ffn.inner.weight
    assert weight.abs().max() <= 0.04 + 1e-6  # cut at two standard deviations
    assert 0.015 < weight.std() < 0.02


def test_sasrec_official_init_is_glorot_uniform_per_matrix():
    m = small("sasrec", hidden=64, max_len=50)  # 41 item ids
    attention = m.encoder.blocks[0].attention
    for name, weight, fan in [("E", m.encoder.item_embedding.weight[1:], 41 + 64),
                              ("P", m.encoder.position_embedding.weight, 50 + 64),
                              ("W^Q", attention.qkv.weight[:64], 128), ("W^V", attention.qkv.weight[128:], 128),
                              ("W1", m.encoder.blocks[0].ffn.inner.weight, 128)]:
        limit = math.sqrt(6 / fan)  # TF's glorot_uniform on the official code's [fan_in, fan_out] matrix
        assert weight.abs().max() <= limit and weight.abs().max() > 0.9 * limit, name
        assert abs(weight.std() - limit / math.sqrt(3)) < 0.15 * limit / math.sqrt(3), name
    assert torch.all(m.encoder.item_embedding.weight[0] == 0) and torch.all(attention.qkv.bias == 0)
    assert attention.out is None  # no W^O in the official block


# ------------------------------------------------------------------------ the packed encoder = the equations
ENCODER_VARIANTS = [
    dict(block="post-ln", positions="start", token_type=True, embedding_norm=True),  # BERT4Rec, official
    dict(block="post-ln", positions="end", embedding_norm=True, layer_norm_eps=1e-5),  # BERT4Rec, before
    dict(block="sasrec", causal=True, activation="relu", scale_embedding=True, embedding_norm=False,
         init="xavier", layer_norm_eps=1e-8),  # SASRec, official
    dict(block="pre-ln", causal=True, activation="relu", embedding_norm=False),  # SASRec, textbook
    dict(block="sasrec", causal=True, activation="relu", use_residual=False, use_position=False),
    dict(block="post-ln", use_ffn=False, use_layernorm=False),
]


@pytest.mark.parametrize("variant", ENCODER_VARIANTS)
@pytest.mark.parametrize("last_only", [False, True])
@pytest.mark.parametrize("dropout_path", [False, True])
def test_packed_encoder_gives_the_plain_equations_outputs_and_gradients(variant, last_only, dropout_path,
                                                                        monkeypatch):
    """``dropout_path``: the packed encoder trains with dropout whose masks keep everything (p = 1e-7, a scale
    within the tolerance), so that its CPU training path runs: the recomputed attention on the batch in length
    order, one sequence a slice for the longest (11 items) and the two shorter ones together."""
    config = EncoderConfig(vocab_size=41, max_len=14, hidden=16, heads=2, ffn_inner=32, dropout=0.0,
                           attention_dropout=0.0, **variant)
    torch.manual_seed(0)
    plain = SequenceEncoder(config).train()
    if dropout_path:
        config = dataclasses.replace(config, dropout=1e-7, attention_dropout=1e-7)
        monkeypatch.setattr(transformer_fast, "dropout_keep_mask",
                            lambda shape, p, device: torch.ones(shape, dtype=torch.bool, device=device))
        monkeypatch.setattr(transformer_fast, "_ATTENTION_SLICE_FLOATS", 2 * 11 * 11)
    packed = PackedSequenceEncoder(config).train()
    packed.load_state_dict(plain.state_dict())
    items = HISTORIES  # three left-padded rows of 5, 11 and 1 items
    weight = torch.randn(3 if last_only else int((items != 0).sum()), 16)  # any function of the outputs

    def run(encoder):
        encoder.zero_grad()
        out, _ = encoder(items, last_only=last_only)
        (out * weight).sum().backward()
        return out, {name: p.grad.clone() for name, p in encoder.named_parameters() if p.grad is not None}

    (out_plain, grads_plain), (out_packed, grads_packed) = run(plain), run(packed)
    assert out_plain.shape == out_packed.shape and torch.allclose(out_plain, out_packed, atol=1e-5)
    assert grads_plain.keys() == grads_packed.keys() and len(grads_plain) > 5
    for name, grad in grads_plain.items():  # float32 sums in a different order: tolerance relative to the largest
        assert (grad - grads_packed[name]).abs().max() <= 1e-5 * grad.abs().max() + 1e-6, name


def test_packed_encoder_is_what_the_models_run():
    for model in ("sasrec", "sasrec-ce", "bert4rec", "bert4rec-1mask", "bert4rec-rel"):
        assert type(small(model).encoder) is PackedSequenceEncoder


# ------------------------------------------------------------------- SASRec's block = the authors' TF code
def official_sasrec(m: SASRec, items: torch.Tensor) -> torch.Tensor:
    """kang205/SASRec's model.py and modules.py transcribed line by line (dropout off) with the weights of ``m``:
    the (B, T, d) output of the final LayerNorm, T = maxlen columns."""
    enc, d = m.encoder, m.config.hidden
    heads = m.config.heads

    def normalize(x, ln):  # modules.normalize: moments over the last axis, epsilon 1e-8
        mean, variance = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        return ln.weight * (x - mean) / (variance + 1e-8) ** 0.5 + ln.bias

    def dense(x, w, b):
        return x @ w.T + b

    mask = (items != 0).float()[..., None]
    table = torch.cat([torch.zeros(1, d), enc.item_embedding.weight[1:]])  # zero_pad=True
    seq = table[items] * d ** 0.5  # scale=True
    seq = seq + enc.position_embedding.weight[torch.arange(items.shape[1])]  # tf.range(maxlen)
    seq = seq * mask
    for block in enc.blocks:
        queries, keys = normalize(seq, block.attention_norm), seq
        w, b = block.attention.qkv.weight, block.attention.qkv.bias
        Q, K, V = dense(queries, w[:d], b[:d]), dense(keys, w[d:2 * d], b[d:2 * d]), dense(keys, w[2 * d:], b[2 * d:])
        Q_, K_, V_ = (torch.cat(t.split(d // heads, dim=2), dim=0) for t in (Q, K, V))  # (h·N, T, C/h)
        outputs = Q_ @ K_.transpose(1, 2) / (d // heads) ** 0.5
        key_masks = torch.sign(keys.abs().sum(-1)).repeat(heads, 1)[:, None, :].expand_as(outputs)
        outputs = torch.where(key_masks == 0, torch.full_like(outputs, -2.0 ** 32 + 1), outputs)
        tril = torch.ones_like(outputs[0]).tril()
        outputs = torch.where(tril == 0, torch.full_like(outputs, -2.0 ** 32 + 1), outputs)
        outputs = outputs.softmax(-1)
        query_masks = torch.sign(queries.abs().sum(-1)).repeat(heads, 1)[:, :, None]
        outputs = outputs * query_masks
        outputs = outputs @ V_
        outputs = torch.cat(outputs.split(len(items), dim=0), dim=2)
        outputs = outputs + queries  # residual from the normalised queries
        inputs = normalize(outputs, block.ffn_norm)  # feedforward(normalize(self.seq))
        hidden = torch.relu(dense(inputs, block.ffn.inner.weight, block.ffn.inner.bias))
        seq = (dense(hidden, block.ffn.outer.weight, block.ffn.outer.bias) + inputs) * mask
    return normalize(seq, enc.final_norm)


@pytest.mark.parametrize("heads", [1, 2])
def test_sasrec_official_block_equals_the_authors_equations(heads):
    m = small("sasrec", heads=heads, dropout=0.0, attention_dropout=0.0, layers=2)
    with torch.no_grad():  # LayerNorm parameters away from (1, 0), so that a mix-up of them would show
        for norm in [m.encoder.final_norm] + [b.attention_norm for b in m.encoder.blocks]:
            norm.weight.normal_(1.0, 0.3)
            norm.bias.normal_(0.0, 0.3)
    expected = official_sasrec(m, HISTORIES)  # HISTORIES: maxlen = 12 columns, as the official input
    assert torch.allclose(hidden_states(m, HISTORIES)[HISTORIES != 0], expected[HISTORIES != 0], atol=1e-5)
    logits = expected[:, -1] @ m.encoder.item_embedding.weight.T  # official test_logits at the last position
    assert torch.allclose(m.score(USERS, HISTORIES, None)[:, 1:], logits[:, 1:], atol=1e-4)
    textbook = small("sasrec", heads=heads, dropout=0.0, attention_dropout=0.0, block="pre-ln")
    kept = {k: v for k, v in m.state_dict().items() if k in textbook.state_dict()}
    textbook.load_state_dict({**textbook.state_dict(), **kept})
    assert not torch.allclose(textbook.score(USERS, HISTORIES, None), m.score(USERS, HISTORIES, None), atol=1e-3)


def test_sasrec_official_block_drops_out_after_both_ffn_layers_and_not_after_attention():
    block = small("sasrec").encoder.blocks[0]
    assert isinstance(block.ffn.inner_dropout, torch.nn.Dropout) and block.ffn.inner_dropout.p == 0.1
    textbook = small("sasrec", block="pre-ln").encoder.blocks[0]
    assert isinstance(textbook.ffn.inner_dropout, torch.nn.Identity)


def test_sasrec_scales_item_embeddings_by_sqrt_d_only_when_asked():
    scaled, plain = small("sasrec", hidden=16), small("sasrec", hidden=16, scale_embedding=False)
    plain.load_state_dict(scaled.state_dict())
    items, positions = torch.tensor([[3]]), torch.tensor([[0]])
    E, P = scaled.encoder.item_embedding.weight[3], scaled.encoder.position_embedding.weight[0]
    assert torch.allclose(scaled.encoder.eval().embed(items, positions)[0, 0], 4.0 * E + P)
    assert torch.allclose(plain.encoder.eval().embed(items, positions)[0, 0], E + P)


# ------------------------------------------------------------------------------------- attention direction
def test_sasrec_is_causal():
    model = small("sasrec")
    changed = HISTORIES.clone()
    changed[1, 8:] = torch.tensor([1, 2, 3, 4])  # the items after column 7
    before, after = hidden_states(model, HISTORIES), hidden_states(model, changed)
    assert torch.allclose(before[1, :8], after[1, :8], atol=1e-6)
    assert not torch.allclose(before[1, 8:], after[1, 8:])


def test_bert4rec_is_bidirectional():
    model = small("bert4rec")
    changed = HISTORIES.clone()
    changed[1, -1] = 39  # only the most recent item
    before, after = hidden_states(model, HISTORIES), hidden_states(model, changed)
    assert not torch.allclose(before[1, 1:6], after[1, 1:6])  # earlier positions see the later item


# ----------------------------------------------------------------------------------------------- padding
# How wide the padding is, batching and candidate scores are checked for every model by the battery of
# benchmarks.check_model (tests/test_check_model.py); what the padding item's embedding holds is the encoder's own.
@pytest.mark.parametrize("model", ["sasrec", "sasrec-ce", "bert4rec", "bert4rec-1mask"])
def test_the_padding_items_embedding_never_changes_scores(model):
    m = small(model)
    scores = m.score(USERS, HISTORIES, None)
    with torch.no_grad():
        m.encoder.item_embedding.weight[0].normal_()  # whatever the padding embedding is
    assert torch.allclose(m.score(USERS, HISTORIES, None)[:, 1:], scores[:, 1:], atol=1e-5)  # 0: padding


def test_history_longer_than_the_model_reads_is_cut_to_the_most_recent_items():
    m = small("sasrec", max_len=4)
    long = histories([[1, 2, 3, 4, 5, 6, 7, 8]], width=8)
    assert torch.allclose(m.score(USERS[:1], long, None), m.score(USERS[:1], long[:, -4:], None))


# ------------------------------------------------------------------------------------------ attention maps
@pytest.mark.parametrize("model", ["sasrec", "bert4rec"])
def test_attention_maps_shape_rows_and_padding(model):
    m = small(model, layers=3, heads=4)
    items, weights = m.attention_weights(HISTORIES[:1, -(m.history_length):], trim=False)
    items, weights = items[0], weights[0]
    T = m.config.max_len
    assert weights.shape == (3, 4, T, T) and items.shape == (T,)
    assert torch.allclose(weights.sum(-1), torch.ones(3, 4, T))
    real = items != 0
    assert torch.all(weights[..., real, :][..., ~real] == 0)  # real positions never attend to padding
    if model == "sasrec":
        assert torch.all(weights.triu(1) == 0)  # nor to the future
    else:
        assert items[-1] == m.mask_token


# ----------------------------------------------------------------------------------------------- windows
def test_sliding_windows_follow_the_official_rule():
    # One history of 7 items, one of 3: windows of 4 with step 2 begin at 3, 1 and 0 (gen_data_fin.py).
    h = Histories(np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]), np.array([0, 7, 10]), np.array([0, 1]))
    rows, ends = sliding_windows(h, 4, 2)
    assert rows.tolist() == [0, 0, 0, 1]
    assert window_matrix(h, rows, ends, 4).tolist() == [[4, 5, 6, 7], [2, 3, 4, 5], [1, 2, 3, 4], [0, 8, 9, 10]]
    rows, ends = sliding_windows(h, 4, 0)  # step 0: only the most recent window
    assert window_matrix(h, rows, ends, 4).tolist() == [[4, 5, 6, 7], [0, 8, 9, 10]]
    rows, ends = sliding_windows(h, 5, 5)  # 7 items, window 5, step 5: begins 2 and 0
    assert window_matrix(h, rows, ends, 5).tolist() == [[3, 4, 5, 6, 7], [1, 2, 3, 4, 5], [0, 0, 8, 9, 10]]


def test_sasrec_examples_are_windows_of_max_len_plus_one():
    h = Histories(np.arange(1, 11), np.array([0, 10]), np.array([0]))
    m = small("sasrec", max_len=4, window_step=1.0)
    examples = m.training_examples(h)
    assert examples["items"].tolist() == [[6, 7, 8, 9, 10], [2, 3, 4, 5, 6], [1, 2, 3, 4, 5]]
    assert small("sasrec", max_len=4).training_examples(h)["items"].tolist() == [[6, 7, 8, 9, 10]]


# -------------------------------------------------------------------------------------------------- losses
def attention_with_dropout(q, k, v, mask, keep, p):
    """Eq. 2 with attention dropout, written out for autograd: (softmax(q kᵀ/√d_h + M) ⊙ keep) v / (1 − p)."""
    return (torch.softmax(q @ k.mT / q.shape[-1] ** 0.5 + mask, dim=-1) * keep) @ v / (1 - p)


def test_recomputed_attention_equals_eq_2_with_the_same_dropout_masks(monkeypatch):
    """CPU training recomputes eq. 2 slice by slice in the backward pass, each slice on the columns where its
    sequences have real positions: on every real query, outputs and gradients must equal autograd's through the
    written-out equation on the padded batch with the same dropout masks, whatever the slice size (a speed
    setting: the masks are drawn for the whole batch) and the side of the padding; without dropout PyTorch's
    attention kernel."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(5, 2, 5, 4, generator=generator) for _ in range(3))  # 2 × 5 × 5 = 50 weights a sequence
    lengths = torch.tensor([3, 5, 1, 4, 3])  # sorted by length, the slices mix the batch's order
    for side in ("left", "right"):
        columns = torch.arange(5)
        real = columns >= 5 - lengths[:, None] if side == "left" else columns < lengths[:, None]  # (B, T)
        spans = torch.stack([real.byte().argmax(1), 5 - real.flip(1).byte().argmax(1)], 1)
        mask = torch.zeros(5, 1, 5, 5).masked_fill_(~real[:, None, None, :], float("-inf"))  # padding keys
        mask[:, :, columns, columns] = 0.0  # each position sees itself
        query_weights = torch.arange(q.numel()).view_as(q).sin() * real[:, None, :, None]  # real queries only

        def run(attend):
            inputs = [t.clone().requires_grad_() for t in (q, k, v)]
            torch.manual_seed(1)
            out = attend(*inputs, mask) * real[:, None, :, None]
            (out * query_weights).sum().backward()
            return out, [t.grad for t in inputs]

        def direct(q, k, v, mask):  # the same masks: one draw for the batch
            keep = transformer_fast.dropout_keep_mask((5, 2, 5, 5), 0.5, q.device)
            return attention_with_dropout(q, k, v, mask, keep, 0.5)

        expected, expected_grads = run(direct)
        # one full sequence a slice (50 weights: not a multiple of the 4 a random draw serves), two, all at once
        for sequences in (1, 2, 5):
            monkeypatch.setattr(transformer_fast, "_ATTENTION_SLICE_FLOATS", sequences * 2 * 5 * 5)
            out, grads = run(lambda *a: transformer_fast._recomputed_attention(*a, 0.5, spans))
            assert torch.allclose(out, expected, atol=1e-6), (side, sequences)
            for grad, expected_grad in zip(grads, expected_grads):
                assert torch.allclose(grad, expected_grad, atol=1e-6), (side, sequences)
    undropped = transformer_fast._attend(q, k, v, mask, 0.0) * real[:, None, :, None]
    assert not torch.allclose(out, undropped, atol=1e-3)  # dropout was applied
    everything = torch.ones(5, 2, 5, 5, dtype=torch.bool)
    assert torch.allclose(attention_with_dropout(q, k, v, mask, everything, 0.0) * real[:, None, :, None],
                          undropped, atol=1e-6)


def test_dropout_masks_keep_with_probability_one_minus_p():
    torch.manual_seed(0)
    for p in (0.1, 0.2, 0.5):
        keep = transformer_fast.dropout_keep_mask((999, 1001), p, torch.device("cpu"))  # not a multiple of 4
        assert keep.dtype == torch.bool and keep.shape == (999, 1001)
        assert abs(keep.float().mean().item() - (1 - p)) < 0.002  # 4 σ at 10⁶
        quarters = keep.flatten()[:999_996].view(-1, 4).float().mean(0)  # the four entries of each draw
        assert (quarters - (1 - p)).abs().max() < 0.004
    assert transformer_fast.dropout_keep_mask((100,), 0.0, torch.device("cpu")).all()
    dropout = transformer_fast.Dropout(0.25)
    x = torch.rand(400, 500) + 1.0
    y = dropout(x)
    assert torch.allclose(y[y != 0], x[y != 0] / 0.75) and abs((y == 0).float().mean().item() - 0.25) < 0.004
    assert torch.equal(dropout.eval()(x), x)
    encoder = small("sasrec").encoder  # the packed encoder's dropouts all draw that way
    assert not any(type(m) is torch.nn.Dropout for m in encoder.modules())


@pytest.mark.parametrize("keep_elements", [0, 500 * 70], ids=["chunked", "kept"])
def test_softmax_cross_entropy_matches_the_plain_one_with_gradients(keep_elements):
    torch.manual_seed(0)
    hidden, weight, bias = (torch.randn(*shape, requires_grad=True) for shape in [(500, 8), (70, 8), (70,)])
    targets = torch.cat([torch.randint(0, 70, (498,)), torch.tensor([3, 3])])  # a repeated target too
    plain = torch.nn.functional.cross_entropy(hidden @ weight.T + bias, targets)
    ours = softmax_cross_entropy(hidden, weight, targets, bias, chunk_elements=70 * 64,  # 8 chunks
                                 keep_elements=keep_elements)
    assert torch.allclose(plain, ours, atol=1e-6)
    for a, b in zip(torch.autograd.grad(plain, [hidden, weight, bias]),
                    torch.autograd.grad(ours, [hidden, weight, bias])):
        assert torch.allclose(a, b, atol=1e-6)


def test_sasrec_ce_loss_is_the_full_softmax_at_non_padding_positions():
    m = small("sasrec-ce", dropout=0.0, attention_dropout=0.0)
    h = Histories(np.array([1, 2, 3, 4, 5, 6, 7, 8]), np.array([0, 5, 8]), np.array([0, 1]))
    batch = m.training_examples(h)
    loss = m.loss(batch, torch.Generator().manual_seed(0))
    inputs, targets = batch["items"][:, :-1], batch["items"][:, 1:]
    logits = hidden_states(m, inputs) @ m.encoder.item_embedding.weight[1:].T
    expected = torch.nn.functional.cross_entropy(logits[inputs != 0], targets[inputs != 0] - 1)
    assert torch.allclose(loss, expected, atol=1e-5)


def test_sasrec_negatives_avoid_the_users_items(monkeypatch):
    from recbench.models import sasrec as module

    drawn = []

    def recording(*args, **kwargs):
        drawn.append(module_uniform(*args, **kwargs))
        return drawn[-1]

    module_uniform = module.uniform_negatives
    monkeypatch.setattr(module, "uniform_negatives", recording)
    m = small("sasrec")
    h = Histories(np.arange(1, 14), np.array([0, 13]), np.array([0]))  # the user has items 1..13 of 40
    m.loss(m.training_examples(h), torch.Generator().manual_seed(0))
    assert len(drawn[0]) == 12 and torch.all(drawn[0] > 13)  # one per input position (12, none padding)


# ---------------------------------------------------------------------------------- learning a chain fast
@pytest.fixture(scope="module")
def chain():
    data = chain_data()
    split = LeaveOneOutSplit(data)
    evaluator = Evaluator(split, seed=0)
    pop = Pop(data.n_users, data.n_items)
    pop.fit(split.train())
    return data, split, evaluator, evaluator.evaluate(pop, "test", "pop100").metrics["NDCG@10"]


def fit_and_score(model, chain, settings) -> float:
    data, split, evaluator, _ = chain
    Trainer(settings, TrainRun(progress=False)).fit(model, split.train(), None)
    return evaluator.evaluate(model, "test", "pop100").metrics["NDCG@10"]


@pytest.mark.parametrize("cls", [SASRec, SASRecCE])
def test_sasrec_learns_the_chain_far_better_than_pop(cls, chain):
    data = chain[0]
    torch.manual_seed(0)
    model = cls(data.n_users, data.n_items, SASRecConfig(max_len=20, hidden=32, dropout=0.1, attention_dropout=0.1))
    ndcg = fit_and_score(model, chain, TrainSettings(lr=5e-3, batch_size=64, max_epochs=8, betas=(0.9, 0.98)))
    assert ndcg > chain[3] + 0.3, (cls.name, ndcg, chain[3])


# ------------------------------------------------------------------------------------------ config errors
@pytest.mark.parametrize("changes, message", [
    ({"hidden": 64, "heads": 3}, "heads=3 must divide hidden=64"),
    ({"block": "textbook"}, "block='textbook' must be one of official, pre-ln, post-ln"),
    ({"init": "normal"}, "init='normal' must be one of truncated_normal, xavier"),
    ({"window_step": 1.5}, "window_step=1.5 must be in [0, 1]"),
    ({"max_len": 0}, "max_len=0 must be >= 1"),
    ({"layers": 0}, "layers=0 must be >= 1"),
    ({"heads": 0}, "heads=0 must be >= 1"),
    ({"dropout": 1.0}, "dropout=1.0 must be in [0, 1)"),
    ({"attention_dropout": -0.5}, "attention_dropout=-0.5 must be in [0, 1)"),
    ({"init_std": -0.02}, "init_std=-0.02 must be > 0"),
    ({"layer_norm_eps": 0.0}, "layer_norm_eps=0.0 must be > 0"),
])
def test_sasrec_config_errors_say_what_to_fix(changes, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        SASRecConfig(**changes)


@pytest.mark.parametrize("changes, message", [
    ({"negatives": 0}, "negatives=0 must be >= 1"),
    ({"window_step": 0.0}, "window_step=0.0 must be in (0, 1]"),
    ({"hidden": 10, "heads": 4}, "heads=4 must divide hidden=10"),
    ({"max_len": 0}, "max_len=0 must be >= 1"),
    ({"layer_norm_eps": -1.0}, "layer_norm_eps=-1.0 must be > 0"),
])
def test_bert4rec_relevance_config_errors_say_what_to_fix(changes, message):
    from recbench.models.bert4rec_relevance import BERT4RecRelevanceConfig

    with pytest.raises(ValueError, match=re.escape(message)):
        BERT4RecRelevanceConfig(**changes)


def test_encoder_config_rejects_unknown_choices():
    with pytest.raises(ValueError, match=re.escape("positions='left' must be one of start, end")):
        EncoderConfig(vocab_size=10, max_len=5, positions="left")


# ------------------------------------------------------------------------------------------ padding trimmed off
SHORT = histories([[3, 7, 1], [5, 2], [40, 4, 9, 12]])  # 8 of 12 columns are padding in every row


def without_trimming(monkeypatch):
    for module in (bert4rec_module, sasrec_module):
        monkeypatch.setattr(module, "trim_padding", lambda *tensors: tensors)


@pytest.mark.parametrize("model,changes", [("bert4rec", {"positions": "start"}), ("bert4rec", {"positions": "end"}),
                                           ("sasrec", {}), ("sasrec-ce", {})])
def test_trimming_the_padding_columns_leaves_the_scores_as_they_are(monkeypatch, model, changes):
    """trim_padding's promise (work changes, results do not), under both position schemes: the scores of a batch
    of short histories with its all-padding columns dropped equal those computed over the whole width."""
    m = small(model, **changes)
    trimmed = m.score(torch.arange(3), SHORT, None)
    without_trimming(monkeypatch)
    assert torch.allclose(m.score(torch.arange(3), SHORT, None), trimmed, atol=1e-6)


@pytest.mark.parametrize("model", ["sasrec", "sasrec-ce"])
def test_trimming_the_padding_columns_leaves_the_training_loss_as_it_is(monkeypatch, model):
    """The same for a training step's loss (dropout off, the same generator: SASRec's negatives are drawn per
    non-padding position, so trimming does not move them)."""
    m = small(model, dropout=0.0, attention_dropout=0.0)
    data = SequenceData.from_sequences("short", [np.array(s) for s in ([3, 7, 1], [5, 2, 8], [40, 4, 9, 12])], 40)
    batch = m.training_examples(LeaveOneOutSplit(data).train())
    m.train()
    trimmed = m.loss(batch, torch.Generator().manual_seed(0))
    without_trimming(monkeypatch)
    assert torch.allclose(m.loss(batch, torch.Generator().manual_seed(0)), trimmed, atol=1e-6)



def test_each_transformer_models_encoder_takes_the_shared_fields_its_config_sets():
    """One mapping of a model's settings to the encoder's (models.transformer.encoder_config): every shared field a
    Config declares reaches the encoder as set, the model's fixed choices stay its own, the rest keep the encoder's
    defaults."""
    from recbench.models.bert4rec import BERT4Rec, BERT4RecConfig
    from recbench.models.bert4rec_relevance import BERT4RecRelevance, BERT4RecRelevanceConfig
    from recbench.models.transformer import SHARED_FIELDS

    changed = {"max_len": 12, "hidden": 32, "layers": 3, "heads": 4, "dropout": 0.3, "attention_dropout": 0.05,
               "use_position": False, "use_ffn": False, "use_layernorm": False, "use_residual": False,
               "layer_norm_eps": 1e-3, "init": "truncated_normal", "init_std": 0.05}
    for model, config in ((SASRec, SASRecConfig), (BERT4Rec, BERT4RecConfig),
                          (BERT4RecRelevance, BERT4RecRelevanceConfig)):
        declared = {field.name for field in dataclasses.fields(config)} & set(SHARED_FIELDS)
        encoder = model(5, 30, config(**{name: changed[name] for name in declared})).encoder.config
        assert {name: getattr(encoder, name) for name in declared} == {name: changed[name] for name in declared}
        defaults = EncoderConfig(vocab_size=1, max_len=1)
        assert all(getattr(encoder, name) == getattr(defaults, name) for name in set(SHARED_FIELDS) - declared)
    sasrec = SASRec(5, 30, SASRecConfig()).encoder.config
    assert sasrec.causal and sasrec.activation == "relu" and sasrec.block == "sasrec"  # the official code's block
    assert BERT4Rec(5, 30, BERT4RecConfig()).encoder.config.activation == "gelu"
