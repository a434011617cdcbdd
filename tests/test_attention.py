"""Fig. 2 as the paper drew it: attention among the last 10 positions averaged over the test users, every layer and
head (``benchmarks.attention``), and the report's heat maps of it."""
import numpy as np
import pytest
import torch

from recbench.benchmarks.attention import average_attention
from recbench.datasets.sequences import Histories
from recbench.reports import generate_report
from tests.fixtures.reports_fixture import ranking_row, write_results
from tests.helpers import small

pytestmark = pytest.mark.usefixtures("one_thread")

LENGTHS = [3, 15, 9, 30, 1]  # history lengths of the test users: some below 10 positions


def view(lengths=LENGTHS, n_items=40) -> Histories:
    rng = np.random.default_rng(0)
    items = rng.integers(1, n_items + 1, sum(lengths))
    return Histories(items, np.r_[0, np.cumsum(lengths)], np.arange(len(lengths)), targets=np.ones(len(lengths)))


def by_hand(model, histories: Histories, last: int = 10):
    """Each user's own map (``attention_weights``, one user at a time, no batching), its last ``last`` positions
    aligned at the end, averaged over the users that have both positions of a cell."""
    total, count = 0.0, np.zeros((last, last))
    for row in range(len(histories)):
        padded = torch.from_numpy(histories.padded(np.array([row]), model.history_length))
        with torch.inference_mode():
            items, weights = model.attention_weights(padded, trim=False)
            items, weights = items[0, -last:].numpy(), weights[0, ..., -last:, -last:].double().numpy()
        present = (items != 0)[:, None] & (items != 0)[None, :]
        total = total + weights * present
        count += present
    return total / np.maximum(count, 1), count


@pytest.mark.parametrize("model_name", ["bert4rec", "sasrec"])
def test_the_average_is_each_users_map_aligned_at_the_end_over_the_users_with_both_positions(model_name):
    model = small(model_name, layers=2, heads=2, max_len=12)
    histories = view()
    found = average_attention(model, histories, batch_size=2)  # batches mix lengths: trimming must not matter
    expected, count = by_hand(model, histories)
    assert found["weights"].shape == (2, 2, 10, 10)
    assert np.array_equal(found["users"], count)
    seen = count > 0
    assert np.allclose(found["weights"][..., seen], expected[..., seen], atol=1e-5)
    assert np.isnan(found["weights"][..., ~seen]).all()
    assert found["offsets"].tolist() == list(range(-10, 0))
    # BERT4Rec's input ends with its [MASK], which every user has; SASRec's with the last item.
    assert bool(found["mask_last"]) == (model_name == "bert4rec")
    positions = np.array(LENGTHS) + (model_name == "bert4rec")  # the [MASK] is one more position
    assert found["users"][-1, -1] == len(LENGTHS)
    assert found["users"][0, 0] == (np.minimum(positions, 11) >= 10).sum()


def test_the_report_draws_every_layer_and_head_of_the_averaged_map(tmp_path):
    model = small("bert4rec", layers=2, heads=2, max_len=12)
    arrays = average_attention(model, view())
    path = tmp_path / "attention" / "ml-1m__bert4rec__seed0__abc.npz"
    path.parent.mkdir(parents=True)
    np.savez(path, **arrays)
    rows = [ranking_row(tmp_path, "ml-1m", "bert4rec", 0, attention_file="attention/ml-1m__bert4rec__seed0__abc.npz")]
    report = generate_report(write_results(tmp_path, rows)).read_text()
    assert "attention_ml-1m_bert4rec.png" in report
    assert "averaged over the users that have both positions of a cell" in report
    assert "every layer and head" in report and "the [MASK]" in report
    # The single-user map stays as an option: asking for a user skips the averaged file.
    report = generate_report(tmp_path, user=3).read_text()
    assert "no attention file holds user 3" in report
