"""Dataset loading: upstream parsers on invented fixtures, preprocessing rules, errors, cache, real data."""
import gzip
import re
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from recbench.datasets import (
    DATASET_NAMES,
    DatasetFormatError,
    LeaveOneOutSplit,
    MissingDataError,
    Preprocessing,
    dataset_names,
    load_dataset,
    loader,
    prepare,
    read_interactions,
    resolve_cache_dir,
    resolve_data_dir,
)
from recbench.datasets.__main__ import main as datasets_cli
from tests.helpers import SHARED_DATA, requires_shared_data

FIXTURES = Path(__file__).parent / "fixtures" / "datasets"


def stage(data_dir: Path, fixture: str, name: str, *, gz: bool = False, zip_member: str | None = None) -> Path:
    """Put a fixture into ``data_dir`` under an upstream name: as is, gzipped, or as a zip member."""
    target = data_dir / name
    target.parent.mkdir(parents=True, exist_ok=True)
    if zip_member:
        with zipfile.ZipFile(target, "w") as archive:
            archive.write(FIXTURES / fixture, zip_member)
    elif gz:
        with open(FIXTURES / fixture, "rb") as src, gzip.open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
    else:
        shutil.copy(FIXTURES / fixture, target)
    return target


def as_lists(data) -> list[list[int]]:
    return [data.sequence(u).tolist() for u in range(data.n_users)]


def dense(sequences: dict) -> list[list[int]]:
    """Expected output for ``{original user: [original items in time order]}``: users in sorted order,
    items renumbered 1..n in sorted order of their original ids."""
    items = sorted({item for sequence in sequences.values() for item in sequence})
    new_id = {item: k for k, item in enumerate(items, 1)}
    return [[new_id[item] for item in sequences[user]] for user in sorted(sequences)]


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "cache"


@pytest.fixture
def data_dir(tmp_path):
    path = tmp_path / "data"
    path.mkdir()
    return path


# --- registry and directories ------------------------------------------------------------------------------

def test_names_cover_the_paper_and_extras():
    assert DATASET_NAMES[:4] == ("beauty", "steam", "ml-1m", "ml-20m")
    assert {"ml-100k", "video", "synthetic", "synthetic-steam", "synthetic-ml-20m"} <= set(DATASET_NAMES)
    assert dataset_names() == list(DATASET_NAMES)


def test_unknown_name_lists_the_valid_ones(cache):
    with pytest.raises(ValueError, match="unknown dataset 'ml-2m'.*beauty, steam, ml-1m, ml-20m"):
        load_dataset("ml-2m", cache_dir=cache)


def test_unknown_source_is_refused(cache):
    with pytest.raises(ValueError, match="no source 'authors'.*'raw'"):
        load_dataset("ml-100k", cache_dir=cache, source="authors")


def test_directory_resolution_prefers_argument_then_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("RECBENCH_DATA_DIR", raising=False)
    monkeypatch.delenv("RECBENCH_CACHE_DIR", raising=False)
    assert resolve_data_dir() is None
    assert resolve_cache_dir() == Path("~/.cache/recbench").expanduser()
    monkeypatch.setenv("RECBENCH_DATA_DIR", str(tmp_path / "env-data"))
    monkeypatch.setenv("RECBENCH_CACHE_DIR", str(tmp_path / "env-cache"))
    assert resolve_data_dir() == tmp_path / "env-data"
    assert resolve_cache_dir() == tmp_path / "env-cache"
    assert resolve_data_dir(tmp_path / "arg") == tmp_path / "arg"
    assert resolve_cache_dir(tmp_path / "arg") == tmp_path / "arg"


def test_environment_data_dir_is_used_by_load_dataset(monkeypatch, data_dir, cache):
    stage(data_dir, "steam.txt", "steam.txt")
    monkeypatch.setenv("RECBENCH_DATA_DIR", str(data_dir))
    assert load_dataset("steam", cache_dir=cache, download=False).n_users == 6


def test_command_line_lists_files_and_prints_table1(data_dir, cache, capsys):
    with pytest.raises(SystemExit):
        datasets_cli(["--help"])
    assert "[raw] ml-1m.zip (holding ml-1m/ratings.dat) or ml-1m/ratings.dat" in capsys.readouterr().out
    stage(data_dir, "steam.txt", "steam.txt")
    datasets_cli(["steam", "synthetic", "--data-dir", str(data_dir), "--cache-dir", str(cache), "--no-download"])
    out = capsys.readouterr().out
    assert "| steam | authors | 6 | 12 | 33 | 5.5 |" in out and "| synthetic | synthetic | 1,000 | 500 |" in out


# --- upstream formats on invented fixtures -----------------------------------------------------------------

def test_ml1m_ratings_dat_in_zip(data_dir, cache):
    """Items < 5 dropped first (1287, 2804), then users < 5 (6 and 7, whose 2804 went); ties keep file order."""
    stage(data_dir, "ratings.dat", "ml-1m.zip", zip_member="ml-1m/ratings.dat")
    data = load_dataset("ml-1m", data_dir, cache, source="raw", download=False)
    assert as_lists(data) == dense({
        1: [661, 1193, 3408, 914, 2355],
        2: [661, 914, 1193, 3408, 1197],  # 914 and 1193 share a timestamp: file order
        3: [1193, 661, 914, 3408, 2355, 1197],
        4: [1197, 2355, 3408, 914, 661, 1193],
        5: [1193, 914, 2355, 1197, 661, 3408],
    })
    assert data.provenance["counts"] == {"rows": 38, "after_duplicates": 38, "after_item_filter": 36,
                                         "users_before_user_filter": 7, "after_user_filter": 28,
                                         "users_with_a_tied_test_item": 0}
    assert data.provenance["member"] == "ml-1m/ratings.dat"


def test_ml1m_ratings_dat_extracted_folder(data_dir, cache):
    stage(data_dir, "ratings.dat", "ml-1m/ratings.dat")
    assert load_dataset("ml-1m", data_dir, cache, source="raw", download=False).n_actions == 28


def test_ml20m_ratings_csv(data_dir, cache):
    """Users < 5 dropped (user 3); no item filter; the file is sorted by movie, so time order must be rebuilt."""
    stage(data_dir, "ratings.csv", "ml-20m/ratings.csv")
    data = load_dataset("ml-20m", data_dir, cache, source="raw", download=False)
    assert as_lists(data) == dense({
        1: [112, 50, 29, 47, 32, 2],
        2: [62, 110, 70, 260, 3],
        4: [6, 10, 19, 32, 34, 39, 47],  # all one timestamp: file order
        5: [11, 62, 2, 17, 25, 32],
    })


def test_both_ml20m_zips_are_told_apart_by_their_members(data_dir, cache):
    stage(data_dir, "ratings.csv", "ml-20m.zip", zip_member="ml-20m/ratings.csv")
    with zipfile.ZipFile(data_dir / "ml-20m.zip", "a") as archive:
        archive.writestr("ml-20m/README.txt", "GroupLens readme")
    data = load_dataset("ml-20m", data_dir, cache, download=False)  # auto: the authors' zip is not there
    assert data.provenance["source"] == "raw" and data.n_users == 4
    (data_dir / "ml-20m.zip").unlink()
    stage(data_dir, "steam.txt", "ml-20m.zip", zip_member="ml-20m.txt")
    data = load_dataset("ml-20m", data_dir, cache, download=False)
    assert data.provenance["source"] == "authors" and data.provenance["member"] == "ml-20m.txt"


def test_amazon_beauty_ratings_csv(data_dir, cache):
    """String ids; repeated (user, item) keeps the earliest, before counting (A1Z5... falls to 4, dropped)."""
    stage(data_dir, "ratings_Beauty.csv", "ratings_Beauty.csv.gz", gz=True)
    data = load_dataset("beauty", data_dir, cache, source="raw", download=False)
    assert as_lists(data) == dense({
        "A39HTATAQ9V7YF": ["0558925278", "0205616461", "0762451459", "0737104473", "0733001998"],
        "A3JM6GV9MNOF9X": ["0205616461", "1304139220", "1304139212", "130414643X", "130414089X",
                           "0733001998"],
        "A1WMRR494NWEWV": ["0205616461", "0733001998", "0737104473", "0762451459", "130414089X",
                           "130414643X"],
        "A3IAAVS479H7M7": ["1304146537", "130414089X", "0558925278", "1304139212", "1304139220"],
    })
    assert data.provenance["counts"]["after_duplicates"] == 28


def test_steam_reviews(data_dir, cache):
    """Python-literal lines (u'' strings, escapes, quotes); dates tie within a day; items < 5 then users < 5."""
    stage(data_dir, "steam_reviews.json", "steam_reviews.json.gz", gz=True)
    data = load_dataset("steam", data_dir, cache, source="raw", download=False, progress=False)
    assert as_lists(data) == dense({
        "Chaos Syren": ["631920", "328100", "725280", "35140", "570"],
        "Ariman1": ["35140", "725280", "328100", "570", "631920"],
        "freakfantom": ["725280", "328100", "35140", "631920", "570"],
        "The_Cpt_FROGGY": ["570", "631920", "35140", "328100", "725280"],
        "Deathbound": ["725280", "35140", "328100", "631920", "570"],  # the earlier of two 725280 reviews
    })
    assert data.provenance["counts"] == {"rows": 37, "after_duplicates": 36, "after_item_filter": 31,
                                         "users_before_user_filter": 7, "after_user_filter": 25,
                                         "users_with_a_tied_test_item": 0}


def test_authors_user_item_file_is_kept_as_published(data_dir, cache):
    stage(data_dir, "steam.txt", "steam.txt")
    stage(data_dir, "steam_reviews.json", "steam_reviews.json.gz", gz=True)
    data = load_dataset("steam", data_dir, cache, download=False)  # auto prefers the authors' file
    published = np.loadtxt(FIXTURES / "steam.txt", dtype=np.int64)
    assert data.provenance["source"] == "authors"
    assert data.items.tolist() == published[:, 1].tolist()
    assert data.lengths.tolist() == np.bincount(published[:, 0])[1:].tolist()
    assert data.n_items == published[:, 1].max()


def test_a_gzipped_copy_is_found_under_the_upstream_name(data_dir, cache):
    stage(data_dir, "steam.txt", "steam.txt.gz", gz=True)
    assert load_dataset("steam", data_dir, cache, download=False).n_actions == 33


def test_provenance_records_file_hash_settings_and_url(data_dir, cache):
    path = stage(data_dir, "steam.txt", "steam.txt")
    provenance = load_dataset("steam", data_dir, cache, download=False).provenance
    assert provenance["file"] == str(path)
    assert provenance["file_sha256"] == loader.sha256_of(path)
    assert provenance["upstream_url"].endswith("FeiSun/BERT4Rec/master/data/steam.txt")
    assert provenance["preprocessing"]["min_user_interactions"] == 5
    assert provenance["format"] == "user-item"


# --- cache ---------------------------------------------------------------------------------------------------

def test_second_load_comes_from_the_cache(data_dir, cache, monkeypatch):
    stage(data_dir, "ratings.csv", "ml-20m/ratings.csv")
    first = load_dataset("ml-20m", data_dir, cache, download=False)
    assert len(list((cache / "prepared").glob("ml-20m-raw-*.npz"))) == 1

    def no_parsing(*args, **kwargs):
        raise AssertionError("the cached dataset should have been used")

    monkeypatch.setattr(loader, "read_interactions", no_parsing)
    second = load_dataset("ml-20m", data_dir, cache, download=False)
    assert second.content_sha256() == first.content_sha256()
    assert second.provenance == first.provenance


def test_a_changed_file_is_prepared_again(data_dir, cache):
    path = stage(data_dir, "steam.txt", "steam.txt")
    before = load_dataset("steam", data_dir, cache, download=False)
    path.write_text(path.read_text() + "6 11\n")
    after = load_dataset("steam", data_dir, cache, download=False)
    assert after.n_actions == before.n_actions + 1
    assert len(list((cache / "prepared").glob("steam-authors-*.npz"))) == 2


def test_an_unreadable_cache_file_is_rebuilt(data_dir, cache):
    stage(data_dir, "steam.txt", "steam.txt")
    load_dataset("steam", data_dir, cache, download=False)
    (cached,) = (cache / "prepared").glob("*.npz")
    cached.write_bytes(b"not an npz")
    assert load_dataset("steam", data_dir, cache, download=False).n_actions == 33


# --- errors --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt, name, text, line, expected", [
    ("ml-dat", "ratings.dat", "1::2::5::978300760\n1::3::4::978300761\n1::4::3\n", 3, "4 fields"),
    ("ml-dat", "ratings.dat", "1::2::5::978300760\n1::x::4::978300761\n", 2, "integer for item"),
    ("udata", "u.data", "196\t242\t3\t881250949\nabc\t302\t3\t891717742\n", 2, "integer for user"),
    ("udata", "u.data", "196\t242\t3\t881250949\n186\t302\t3\t891717742\t7\n", 2, "4 fields"),
    ("user-item", "beauty.txt", "1 1\n1 2\n\n1 3\n", 3, "2 fields"),
    ("user-item", "beauty.txt", "<!DOCTYPE html>\n<html></html>\n", 1, "integer for user"),
    ("user-item", "beauty.txt", "1 1\n1 99999999999999999999\n", 2, "64-bit integer for item"),
    ("ml-csv", "ratings.csv", "userId,movieId,rating,timestamp\n1,2,3.5,1112486027\n1,29,3.5\n", 3,
     "4 fields"),
    ("ml-csv", "ratings.csv", "userId,movieId,rating,timestamp\n1,2,good,1112486027\n", 2, "a number for rating"),
    ("ml-csv", "ratings.csv", "user,item,rating,time\n1,2,3.5,1112486027\n", 1, "the header"),
    ("amazon-csv", "ratings_Beauty.csv", "A39HTATAQ9V7YF,0205616461,5.0,1369699200\n,0558925278,4.0,1355443200\n",
     2, "a non-empty id for user"),
    ("steam-json", "steam_reviews.json", "{u'username': u'a', u'product_id': u'1', u'date': u'2017-12-17'}\n"
                                         "{u'username': u'b', u'product_id': u'1', \n", 2, "Python-literal dict"),
    ("steam-json", "steam_reviews.json", "{u'username': u'a', u'product_id': u'1'}\n", 1, "'date'"),
    ("steam-json", "steam_reviews.json", "{u'username': u'a', u'product_id': u'1', u'date': u'17/12/2017'}\n", 1,
     "YYYY-MM-DD"),
    ("steam-json", "steam_reviews.json", "__import__('os').system('echo unsafe')\n", 1, "Python-literal dict"),
])
def test_bad_lines_are_reported_with_file_and_line(tmp_path, fmt, name, text, line, expected):
    path = write(tmp_path / name, text)
    pattern = rf"{re.escape(name)}: line {line}: expected .*{expected}"
    with pytest.raises(DatasetFormatError, match=pattern) as info:
        read_interactions(path, fmt)
    assert isinstance(info.value, ValueError) and info.value.line == line


STEAM_LINE = "{u'username': u'a', u'product_id': u'1', u'date': u'2017-12-17'}\n"


@pytest.mark.parametrize("fmt, name, text", [
    ("user-item", "beauty.txt", "1 1\n1 2\n2 3\n"),
    ("ml-dat", "ratings.dat", "1::2::5::978300760\r\n1::3::4::978300761\r\n"),
    ("udata", "u.data", "196\t242\t3\t881250949\n186\t302\t3\t891717742\n"),
    ("ml-csv", "ratings.csv", "userId,movieId,rating,timestamp\n1,2,3.5,1112486027\n1,29,3.5,1112484676\n"),
    ("amazon-csv", "ratings_Beauty.csv", "A39HTATAQ9V7YF,0205616461,5.0,1369699200\nB,0558925278,4.0,1355443200\n"),
    ("steam-json", "steam_reviews.json", STEAM_LINE + STEAM_LINE.replace("u'a'", "u'b'")),
])
@pytest.mark.parametrize("ending", ["\n", "\n\n\n", "\r\n", "  \n\t\n"])
def test_blank_lines_at_the_end_of_a_file_are_accepted(tmp_path, fmt, name, text, ending):
    clean = read_interactions(write(tmp_path / name, text), fmt)
    padded = read_interactions(write(tmp_path / f"padded-{name}", text + ending), fmt)
    for column in ("user", "item", "time"):
        assert np.array_equal(getattr(padded, column), getattr(clean, column)), column
    assert padded.first_line == clean.first_line


@pytest.mark.parametrize("fmt, text", [("user-item", "1 1\n\n1 2\n"), ("steam-json", STEAM_LINE + "\n" + STEAM_LINE)])
def test_a_blank_line_between_data_lines_is_still_an_error(tmp_path, fmt, text):
    with pytest.raises(DatasetFormatError, match=r"data: line 2: expected .*blank lines only at the end"):
        read_interactions(write(tmp_path / "data", text), fmt)


@pytest.mark.parametrize("fmt", ["user-item", "steam-json"])
def test_a_file_of_blank_lines_has_no_data(tmp_path, fmt):
    with pytest.raises(DatasetFormatError, match="only blank lines"):
        read_interactions(write(tmp_path / "data", "\n\n"), fmt)


@pytest.mark.parametrize("fmt", ["user-item", "ml-csv", "steam-json"])
def test_empty_file(tmp_path, fmt):
    with pytest.raises(DatasetFormatError, match=r"empty\.txt: expected .*found 'an empty file'"):
        read_interactions(write(tmp_path / "empty.txt", ""), fmt)


def test_header_only_csv(tmp_path):
    with pytest.raises(DatasetFormatError, match="only the header"):
        read_interactions(write(tmp_path / "ratings.csv", "userId,movieId,rating,timestamp\n"), "ml-csv")


def test_unknown_format_names_the_file_and_the_known_formats(tmp_path):
    with pytest.raises(DatasetFormatError, match=r"data\.parquet: expected a known format \(user-item, ml-dat"):
        read_interactions(write(tmp_path / "data.parquet", "PAR1"), "parquet")


def test_a_file_that_is_not_gzip(tmp_path):
    with pytest.raises(DatasetFormatError, match=r"beauty\.txt\.gz: expected a readable file"):
        read_interactions(write(tmp_path / "beauty.txt.gz", "1 1\n"), "user-item")


def test_too_few_interactions_for_the_split_names_the_line(tmp_path):
    path = write(tmp_path / "video.txt", "1 1\n1 2\n1 3\n2 4\n2 1\n3 1\n3 2\n3 3\n")
    with pytest.raises(DatasetFormatError, match=r"video\.txt: line 4: expected at least 3 interactions .* has 2"):
        prepare(read_interactions(path, "user-item"), Preprocessing(0, 0), "video")
    data = prepare(read_interactions(path, "user-item"), Preprocessing(0, 3), "video")
    assert data.n_users == 2
    LeaveOneOutSplit(data)  # every user now has enough for the split


def test_a_zip_without_the_expected_member_is_not_taken(data_dir, cache):
    with zipfile.ZipFile(data_dir / "ml-1m.zip", "w") as archive:
        archive.writestr("ml-1m/movies.dat", "1::Toy Story (1995)::Animation\n")
    with pytest.raises(MissingDataError, match="ml-1m.zip"):
        load_dataset("ml-1m", data_dir, cache, source="raw", download=False)


def test_offline_message_says_which_files_go_where(data_dir, cache):
    with pytest.raises(MissingDataError) as info:
        load_dataset("steam", data_dir, cache, download=False)
    message = str(info.value)
    for needed in (str(data_dir), "steam.txt (or steam.txt.gz)", "steam_reviews.json (or steam_reviews.json.gz)",
                   "RECBENCH_DATA_DIR", "--data-dir", "download=False",
                   "https://raw.githubusercontent.com/FeiSun/BERT4Rec/master/data/steam.txt",
                   "https://cseweb.ucsd.edu/~wckang/steam_reviews.json.gz"):
        assert needed in message


def test_offline_message_without_a_data_dir(monkeypatch, cache):
    monkeypatch.delenv("RECBENCH_DATA_DIR", raising=False)
    with pytest.raises(MissingDataError, match="Put one of these files into a data directory"):
        load_dataset("ml-1m", cache_dir=cache, download=False)


# --- real data (staged copies; skipped where absent) ---------------------------------------------------------

def test_a_skipped_real_data_test_says_how_to_run_it():
    """Issue 29: the skip said the folder was absent, not that RECBENCH_DATA_DIR turns these tests on."""
    assert "set RECBENCH_DATA_DIR to the folder of the dataset files" in requires_shared_data.kwargs["reason"]


@requires_shared_data
def test_ml1m_full_sequences_give_the_paper_counts(cache):
    data = load_dataset("ml-1m", SHARED_DATA, cache, download=False)
    assert data.provenance["source"] == "sequences"
    assert (data.n_users, data.n_items, data.n_actions) == (6040, 3416, 999_611)
    assert data.provenance["counts"]["rows"] == 1_000_209
    assert data.stats()["avg_length"] == pytest.approx(165.4985, abs=1e-4)
    paper = data.stats(holdout=2)  # Table 1: 163.5 and 4.79%
    assert round(paper["avg_length"], 1) == 163.5 and round(100 * paper["density"], 2) == 4.79
    assert data.lengths.min() >= 18
    LeaveOneOutSplit(data)


@requires_shared_data
def test_beauty_authors_file_gives_the_paper_counts(cache):
    data = load_dataset("beauty", SHARED_DATA, cache, download=False)
    assert (data.n_users, data.n_items, data.n_actions) == (40_226, 54_542, 353_962)
    assert round(data.stats()["avg_length"], 1) == 8.8
    published = pd.read_csv(SHARED_DATA / "beauty.txt.gz", sep=" ", header=None).to_numpy()
    assert np.array_equal(data.items, published[:, 1])  # already dense and time-ordered: kept as published


@requires_shared_data
def test_ml100k_raw_parser_on_the_real_file(cache):
    raw = pd.read_csv(SHARED_DATA / "ml-100k_u.data.gz", sep="\t", header=None, names=["user", "item", "r", "ts"])
    interactions = read_interactions(SHARED_DATA / "ml-100k_u.data.gz", "udata")
    assert len(interactions) == 100_000 and len(np.unique(interactions.user)) == 943
    data = load_dataset("ml-100k", SHARED_DATA, cache, download=False)
    assert (data.n_users, data.n_items, data.n_actions) == (943, 1349, 99_287)
    # Independent reference: items >= 5, then users >= 5, stable time sort, ids in sorted order.
    kept = raw[raw.groupby("item")["item"].transform("size") >= 5]
    kept = kept[kept.groupby("user")["user"].transform("size") >= 5]
    kept = kept.sort_values(["user", "ts"], kind="stable")
    expected = kept["item"].map({item: k for k, item in enumerate(sorted(kept["item"].unique()), 1)})
    assert np.array_equal(data.items, expected.to_numpy())
    # Every user's sequence is in timestamp order.
    assert (np.diff(kept["ts"].to_numpy())[np.diff(kept["user"].to_numpy()) == 0] >= 0).all()


@requires_shared_data
def test_ratings_csv_parser_on_the_real_file(cache):
    data = load_dataset("ml-latest-small", SHARED_DATA, cache, download=False)
    assert (data.n_users, data.n_items, data.n_actions) == (610, 9724, 100_836)
    raw = pd.read_csv(SHARED_DATA / "ml-latest-small_ratings.csv.gz").sort_values(["userId", "timestamp"],
                                                                                  kind="stable")
    expected = raw["movieId"].map({m: k for k, m in enumerate(sorted(raw["movieId"].unique()), 1)})
    assert np.array_equal(data.items, expected.to_numpy())


@requires_shared_data
def test_video_drops_users_below_five(cache):
    data = load_dataset("video", SHARED_DATA, cache, download=False)
    assert (data.n_users, data.n_items, data.n_actions) == (29_341, 23_464, 280_945)
    assert data.lengths.min() == 5
