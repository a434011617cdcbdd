"""Logs of the user's own (``datasets/logs.py``): a CSV/TSV file with a column mapping, or a DataFrame, prepared
under the registry's preprocessing choices; the same rows give the same keys and metrics either way; a bad file
is one line naming the file, the line and the column, before anything trains."""
import gzip

import pandas as pd
import pytest

import run_all
from recbench.benchmarks.api import run
from recbench.benchmarks.store import read_results
from recbench.datasets import InteractionLog, LogFormat, generate, load_log, log_entries, log_format
from recbench.datasets.errors import DatasetFormatError

MAPPING = {"user": "uid", "item": "iid", "time": "ts", "rating": "stars"}


def clicks(n_users=150, n_items=200) -> pd.DataFrame:
    """A log with text user ids, dates for times, ratings (every fifth below 3) and its rows shuffled."""
    data = generate(n_users, n_items, 10.0, seed=5)
    rows = [(f"user{user}", int(item) * 3, pd.Timestamp("2021-03-01") + pd.Timedelta(hours=step), 1 + step % 5)
            for user in range(data.n_users) for step, item in enumerate(data.sequence(user))]
    frame = pd.DataFrame(rows, columns=["uid", "iid", "ts", "stars"])
    return frame.sample(frac=1.0, random_state=0).reset_index(drop=True)


def test_a_csv_log_with_a_mapping_and_the_same_dataframe_give_identical_keys_and_metrics(tmp_path, capsys):
    frame = clicks()
    path = tmp_path / "clicks.csv"
    frame.assign(ts=frame["ts"].dt.strftime("%Y-%m-%dT%H:%M:%S")).to_csv(path, index=False)  # dates as text
    common = ["--models", "pop", "bprmf", "--set", "bprmf:max_epochs=2", "--cache-dir", str(tmp_path / "cache"),
              "--quiet", "--no-report"]
    assert run_all.main(["--datasets", f"clicks={path}", "--columns", *(f"{role}={column}" for role, column in
                                                                       MAPPING.items()),
                         "--filters", "min_rating=3", "--output", str(tmp_path / "csv"), *common]) == 0
    from_csv = read_results(tmp_path / "csv" / "results.jsonl")
    from_frame = run({"clicks": frame}, ["pop", "bprmf"], settings=["bprmf:max_epochs=2"],
                     log_format={**MAPPING, "min_rating": 3}, output=tmp_path / "frame", progress=False,
                     cache_dir=tmp_path / "cache", log=lambda *a: None)
    assert [row["key"] for row in from_csv] == from_frame["key"].tolist() and len(from_csv) == 4
    assert [row["metrics"] for row in from_csv] == from_frame["metrics"].tolist()
    assert from_csv[0]["dataset_info"]["sha256"] == from_frame["dataset_info"][0]["sha256"]
    rated = frame[frame["stars"] >= 3].groupby("uid").size()  # min_rating, then users with >= 5 of them
    assert from_csv[0]["dataset_info"]["stats"]["actions"] == rated[rated >= 5].sum() < len(frame)
    assert from_csv[0]["dataset_info"]["provenance"]["source"] == "file"
    assert from_frame["dataset_info"][0]["provenance"]["source"] == "DataFrame"


def test_preprocessing_is_the_registrys_stable_time_sort_duplicates_and_filters(tmp_path):
    path = tmp_path / "log.tsv"
    path.write_text("who\twhat\twhen\tstars\n"
                    "b\t7\t2\t5\n"
                    "a\t30\t5\t4\n"
                    "a\t10\t5\t5\n"  # same time as the line above: file order kept
                    "a\t20\t1\t1\n"  # below min_rating
                    "a\t40\t9\t5\n"
                    "a\t30\t9\t5\n"  # a repeated pair: the earliest is kept
                    "b\t10\t1\t5\n"
                    "b\t99\t3\t5\n"  # item 99 is seen once: dropped by min_item_interactions=2
                    "b\t30\t4\t3\n"
                    "b\t40\t8\t3\n"
                    "c\t7\t1\t5\n")  # user c keeps 1 interaction: dropped by min_user_interactions=3
    fmt = LogFormat(user="who", item="what", time="when", rating="stars", min_rating=3, min_item_interactions=2,
                    min_user_interactions=3)
    data = load_log(InteractionLog(path, fmt), "tiny", cache_dir=tmp_path / "cache", progress=False)
    # Items 7, 10, 30, 40 seen at least twice -> ids 1..4 in sorted order; users a, b.
    assert data.n_items == 4 and data.n_users == 2
    assert [list(data.sequence(u)) for u in range(2)] == [[3, 2, 4], [2, 1, 3, 4]]
    assert data.provenance["counts"] == {"rows": 10, "after_duplicates": 9, "after_item_filter": 8,
                                         "users_before_user_filter": 3, "after_user_filter": 7,
                                         "users_with_a_tied_test_item": 0}
    assert data.provenance["format"]["min_rating"] == 3 and data.provenance["file"] == str(path)


def test_a_prepared_file_is_cached_and_prepared_again_when_it_changes(tmp_path, monkeypatch):
    path = tmp_path / "log.csv.gz"
    with gzip.open(path, "wt") as file:
        file.write(clicks().to_csv(index=False))
    log = InteractionLog(path, LogFormat(**MAPPING))
    first = load_log(log, "logs", cache_dir=tmp_path, progress=False)
    from recbench.datasets import loader

    monkeypatch.setattr(loader, "read_log", lambda *args: pytest.fail("the cache was not used"))
    assert load_log(log, "logs", cache_dir=tmp_path, progress=False).content_sha256() == first.content_sha256()
    monkeypatch.undo()
    with gzip.open(path, "wt") as file:
        file.write(clicks().iloc[:-40].to_csv(index=False))
    assert load_log(log, "logs", cache_dir=tmp_path, progress=False).content_sha256() != first.content_sha256()


GOOD = "uid,iid,ts,stars\nu1,7,100,5\nu1,8,101,4\nu1,9,102,5\n"


@pytest.mark.parametrize("text, fmt, message", [
    ("uid,item\nu1,7\n", {}, "clicks.csv: line 1: no column 'user' for the user in the header (separator ',') (uid, "
                             "item); name it with --columns user=COLUMN"),
    # Issue 29: a separator other than the file's pointed at --columns user=COLUMN, not at sep=.
    ("user;item\nu1;7\n", {}, "clicks.csv: line 1: the header 'user;item' is one column when split at ',', but its "
                              "names are separated by ';'; read the file with --columns 'sep=;'"),
    ("user\titem\nu1\t7\n", {}, "read the file with --columns 'sep=tab'"),
    # A bad cell is quoted, not its whole line (issue 29: a bad time was lost in the line's other fields).
    (GOOD + ",7,103,5\n", MAPPING, "clicks.csv: line 5: expected a user id in column 'uid'; found ''"),
    (GOOD + "u2,,103,5\n", MAPPING, "clicks.csv: line 5: expected an item id in column 'iid'; found ''"),
    (GOOD + "u2,7,yesterday,5\n", MAPPING, "clicks.csv: line 5: expected a time (a number, e.g. unix seconds, or an "
                                           "ISO 8601 date) in column 'ts'; found 'yesterday'"),
    (GOOD + "u2,7,103,five\n", {**MAPPING, "min_rating": 3}, "clicks.csv: line 5: expected a numeric rating in "
                                                              "column 'stars'; found 'five'"),
    (GOOD + "u2,7,103,5,extra\n", MAPPING, "clicks.csv: line 5: expected 4 fields, as many as the header names; "
                                           "found 'u2,7,103,5,extra'"),
    (GOOD + "u2,7,103,5,extra,more\n", MAPPING, "clicks.csv: line 5: expected 4 fields, as many as the header "
                                                "names; found '6 fields'"),
    ("uid,iid,uid\nu1,7,u1\n", MAPPING, "clicks.csv: line 1: expected a header line naming the columns, each "
                                        "once; found 'uid,iid,uid'"),
    ("uid,iid,ts,stars\nu1,7,100,5\n\nu1,8,101,4\n\n", MAPPING, "clicks.csv: line 3: expected a user id in column "
                                                                 "'uid'; found ''"),
    ("", MAPPING, "clicks.csv: line 1: expected a header line naming the columns, each once; found 'an empty line'"),
    ("uid,iid,ts,stars\n\n", MAPPING, "clicks.csv: expected lines of interactions after the header; found 'none'"),
    ("uid,iid\nu1,7\n", {"user": "uid", "item": "iid", "min_rating": 3},
     "clicks.csv: min_rating=3 needs a rating column; name it with --columns rating=COLUMN"),
    (GOOD + "u2,7,103,5\n", {**MAPPING, "min_user_interactions": 0},
     "clicks.csv: line 5: expected at least 3 interactions per user for the leave-one-out split, but the user of "
     "this line has 1 after preprocessing"),
    ("uid,iid,ts,stars\nu1,7,100,1\n", {**MAPPING, "min_rating": 3},
     "clicks.csv: expected rows rated at least min_rating=3; found 'none'"),
    # No user left: which filter, how many a user has, the setting that keeps some (issue 29: a Python repr).
    (GOOD + "u2,7,103,5\nu2,8,104,5\nu2,9,105,5\nu2,10,106,5\n", MAPPING, "clicks.csv: expected users left "
     "after min_user_interactions=5 (the most interactions a user has after the item filter is 4); lower it with "
     "--filters min_user_interactions=4"),
    ("uid,iid\nu1,7\nu1,8\nu2,7\n", {"user": "uid", "item": "iid"}, "clicks.csv: expected users left after "
     "min_user_interactions=5 (the most interactions a user has after the item filter is 2); the leave-one-out "
     "split needs 3 per user, so this log cannot be split"),
    (GOOD, {**MAPPING, "min_item_interactions": 2}, "clicks.csv: expected items left after min_item_interactions=2 "
     "(no item has that many interactions); lower it with --filters min_item_interactions=N"),
])
def test_a_bad_log_is_one_line_naming_the_file_line_and_column(tmp_path, text, fmt, message):
    path = tmp_path / "clicks.csv"
    path.write_text(text)
    with pytest.raises((DatasetFormatError, ValueError)) as raised:
        load_log(InteractionLog(path, LogFormat(**fmt)), "clicks", cache_dir=tmp_path, progress=False)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_preparing_a_log_counts_what_each_step_dropped_on_the_console(tmp_path, capsys):
    """Issue 29: repeated rows and users dropped by the filters were not counted where a user looks."""
    lines = [f"u{user},{item},{100 * user + item}" for user in range(6) for item in range(1, 6)]
    lines += ["u0,3,999", "u0,4,998", "u9,1,1", "u9,2,2"]  # two repeated pairs; a user with 2 interactions
    path = tmp_path / "clicks.csv"
    path.write_text("uid,iid,ts\n" + "\n".join(lines) + "\n")
    data = load_log(InteractionLog(path, LogFormat(user="uid", item="iid")), "clicks", cache_dir=tmp_path)
    (line,) = [text for text in capsys.readouterr().err.splitlines() if text.startswith("clicks: 34 rows")]
    assert "dropped 2 repeated (user, item) row(s), 1 user(s) with fewer than min_user_interactions=5 (2 row(s))" \
           in line and "left 6 users, 5 items, 30 interactions" in line
    assert (data.n_users, data.n_actions) == (6, 30)
    # The ts column is not named as the time: an untimed log, ordered by the file alone, has no ties to count.
    assert "users_with_a_tied_test_item" not in data.provenance["counts"] and "same time" not in line


def test_the_console_counts_the_users_whose_test_item_the_files_order_among_equal_times_chose(tmp_path, capsys):
    # u0's last two interactions share time 5, u1's do not; u2's first two tie, which leaves its targets alone.
    lines = ["u0,1,1", "u0,2,2", "u0,3,3", "u0,4,5", "u0,5,5", "u1,1,1", "u1,2,2", "u1,3,3", "u1,4,4", "u1,5,5",
             "u2,1,1", "u2,2,1", "u2,3,3", "u2,4,4", "u2,5,5"]
    path = tmp_path / "clicks.csv"
    path.write_text("user,item,time\n" + "\n".join(lines) + "\n")
    data = load_log(InteractionLog(path, LogFormat()), "clicks", cache_dir=tmp_path)
    (line,) = [text for text in capsys.readouterr().err.splitlines() if text.startswith("clicks: 15 rows")]
    assert ("1 user(s) (33%) have a test item with the same time as the item before it, and the file's order chose "
            "which is last") in line
    assert data.provenance["counts"]["users_with_a_tied_test_item"] == 1
    assert data.items[data.offsets[1] - 1] == 5  # the file's order: item 5 after item 4


def test_a_truncated_gzip_file_trains_nothing_and_is_one_line(tmp_path, capsys):
    path = tmp_path / "clicks.csv.gz"
    path.write_bytes(gzip.compress(clicks().to_csv(index=False).encode())[:-200])
    code = run_all.main(["--datasets", str(path), "--columns", "user=uid", "item=iid", "--models", "pop",
                         "--output", str(tmp_path / "out"), "--cache-dir", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and not (tmp_path / "out" / "results.jsonl").exists()
    assert err.startswith(f"error: dataset 'clicks': {path}: expected a readable UTF-8 text file (plain or .gz)")


def test_a_dataframes_fault_names_its_row_and_column():
    frame = pd.DataFrame({"user": [1, 1, None, 1], "item": [5, 6, 7, 8]})
    with pytest.raises(DatasetFormatError, match=r"^DataFrame 'mine': row 2: expected a user id in column 'user'$"):
        load_log(InteractionLog(frame), "mine")
    frame = pd.DataFrame({"user": [1, 1, 1], "item": [5, 6, 7], "time": [1, "soon", 3]})
    with pytest.raises(DatasetFormatError, match=r"^DataFrame 'mine': row 1: expected a time .* in column 'time'; "
                                                 r"found 'soon'$"):
        load_log(InteractionLog(frame), "mine")
    with pytest.raises(ValueError, match="DataFrame 'mine': no column 'uid' for the user in its columns"):
        load_log(InteractionLog(frame, LogFormat(user="uid")), "mine")


@pytest.mark.parametrize("argv, message", [
    (["--datasets", "ml-1m=clicks.csv"], "dataset name 'ml-1m' (of clicks.csv) is a registered dataset's; give the "
                                         "log another name, e.g. --datasets my-ml-1m=clicks.csv"),
    (["--datasets", "clicks.csv", "--columns", "usr=uid"], "--columns 'usr=uid': unknown key 'usr'; expected one of "
                                                           "user, item, time, rating, sep"),
    (["--datasets", "clicks.csv", "--filters", "min_rating=high"], "--filters 'min_rating=high': min_rating must be a "
                                                                   "number"),
    (["--datasets", "clicks.csv", "--filters", "min_user_interactions=-1"], "--filters: min_user_interactions=-1 "
                                                                            "must be >= 0 (0 turns the filter off)"),
    (["--datasets", "synthetic", "--columns", "user=uid"], "--columns and --filters describe logs of your own"),
    (["--datasets", "nosuchdata"], "unknown dataset 'nosuchdata'; expected one of beauty, "),
])
def test_bad_data_options_are_one_line_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as raised:
        run_all.parse_args(argv)
    assert raised.value.code == 2 and message in capsys.readouterr().err.strip().splitlines()[-1]


def test_a_missing_log_file_is_named_before_anything_trains(tmp_path, capsys):
    code = run_all.main(["--datasets", str(tmp_path / "nowhere.csv"), "--models", "pop", "--output",
                         str(tmp_path / "out"), "--cache-dir", str(tmp_path), "--quiet"])
    assert code == 2 and capsys.readouterr().err.strip() == (f"error: dataset 'nowhere': {tmp_path / 'nowhere.csv'}: "
                                                             f"no such file")


def test_dataset_entries_name_logs_by_their_stem_or_as_given():
    names, logs = log_entries(["synthetic", "data/clicks.csv.gz", "views=data/v.tsv"], log_format(["user=uid"]))
    assert names == ["synthetic", "clicks", "views"]
    assert logs["clicks"].source.name == "clicks.csv.gz" and logs["views"].format.user == "uid"
    with pytest.raises(ValueError, match="two logs are named 'clicks'"):
        log_entries(["a/clicks.csv", "b/clicks.csv"], LogFormat())
    fmt = log_format(["sep=\\t"], ["min_item_interactions=5"])
    assert fmt.sep == "\t" and fmt.preprocessing.min_item_interactions == 5
