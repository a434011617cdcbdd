"""Which ML-1m file a row used: the authors' ``ml-1m.txt`` (their order of same-second ratings) is preferred over the
staged ``ml-1m_seq_full.txt`` (another pipeline's order) when both are in the data folder, and the row's provenance
names the one read."""
from __future__ import annotations

from recbench.datasets import load_dataset


def write(path, sequences) -> None:
    path.write_text("".join(f"{user} {item}\n" for user, items in sequences.items() for item in items))


def test_the_authors_file_is_preferred_and_recorded(tmp_path):
    items = list(range(1, 8))
    write(tmp_path / "ml-1m_seq_full.txt", {user: items for user in (1, 2, 3, 4, 5)})
    first = load_dataset("ml-1m", data_dir=tmp_path, cache_dir=tmp_path / "cache", download=False, progress=False)
    assert first.provenance["source"] == "sequences"
    # the same interactions, the last two of each user in the other order: the authors' file wins
    write(tmp_path / "ml-1m.txt", {user: [*items[:-2], items[-1], items[-2]] for user in (1, 2, 3, 4, 5)})
    chosen = load_dataset("ml-1m", data_dir=tmp_path, cache_dir=tmp_path / "cache", download=False, progress=False)
    assert chosen.provenance["source"] == "authors" and chosen.provenance["file"].endswith("ml-1m.txt")
    assert chosen.content_sha256() != first.content_sha256()  # so the rows' data hashes and job keys differ too
