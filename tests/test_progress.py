"""Progress output of the steps that can take a while: reading and preparing a dataset, generating synthetic
data, sampling negatives. Each shows a bar only once it has run for a few seconds (the delay is set to 0
here) and nothing at all with ``progress=False``."""
import numpy as np
import pytest

from recbench.benchmarks.negatives import load_or_sample
from recbench.datasets import LeaveOneOutSplit, generate, load_dataset, progress, read_interactions


@pytest.fixture
def no_delay(monkeypatch):
    monkeypatch.setattr(progress, "PROGRESS_DELAY_S", 0.0)


def test_negative_sampling_shows_users_done(no_delay, capsys):
    data = generate(300, 200, 12.0, seed=0, name="toy")
    first = load_or_sample(LeaveOneOutSplit(data), "test", "pop100", 0, None)
    assert "toy: sampling pop100 test negatives" in capsys.readouterr().err
    again = load_or_sample(LeaveOneOutSplit(data), "test", "pop100", 0, None, progress=False)
    assert capsys.readouterr().err == ""
    assert np.array_equal(first, again)  # the bar changes nothing drawn


def test_reading_a_file_shows_bytes_read(no_delay, capsys, tmp_path):
    path = tmp_path / "ratings.dat"
    path.write_text("".join(f"{u}::{i}::5::97830076{i}\n" for u in range(1, 4) for i in range(1, 8)))
    assert len(read_interactions(path, "ml-dat", progress=True)) == 21
    assert "reading ratings.dat" in capsys.readouterr().err
    assert len(read_interactions(path, "ml-dat", progress=False)) == 21
    assert capsys.readouterr().err == ""


def test_preparing_a_dataset_says_what_it_does(capsys, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "beauty.txt").write_text("".join(f"{u} {i}\n" for u in range(1, 4) for i in range(1, 7)))
    load_dataset("beauty", tmp_path / "data", tmp_path / "cache", download=False)
    err = capsys.readouterr().err
    assert "beauty: preparing from" in err and "18 interactions read" in err and "beauty: prepared in" in err
    load_dataset("beauty", tmp_path / "data", tmp_path / "cache", download=False)  # from the cache: quiet
    assert capsys.readouterr().err == ""
    load_dataset("beauty", tmp_path / "data", tmp_path / "other-cache", download=False, progress=False)
    assert capsys.readouterr().err == ""


def test_generating_synthetic_data_shows_users_done(no_delay, capsys):
    data = generate(500, 100, 10.0, seed=3, name="toy", progress=True)
    assert "generating toy" in capsys.readouterr().err
    assert generate(500, 100, 10.0, seed=3, name="toy").content_sha256() == data.content_sha256()
    assert capsys.readouterr().err == ""


def test_bars_redraw_in_place_on_a_terminal_or_in_a_notebook_not_in_a_log(monkeypatch, tmp_path):
    """Where they cannot redraw in place (stderr a file), bars redraw once a minute and training writes a line an
    epoch; a notebook's widget bars (``tqdm.auto`` picks them) redraw in place although stderr is no terminal."""
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    assert progress.bars_redraw_in_place()
    with open(tmp_path / "run.log", "w") as log:
        monkeypatch.setattr(sys, "stderr", log)
        assert not progress.bars_redraw_in_place()
        assert progress.progress_bar(10, "log").mininterval == progress.LOG_REFRESH_S

        class NotebookBar(progress.tqdm):
            pass

        monkeypatch.setattr(progress.autonotebook, "tqdm", NotebookBar)
        assert progress.bars_redraw_in_place()


def test_a_bar_in_a_log_file_writes_whole_lines_and_keeps_its_end(monkeypatch, tmp_path):
    """A log file cannot be redrawn: each drawing of a bar is a line of its own (no ``\\r``), the drawing that
    clears a bar on a terminal writes nothing, and the last line is the bar's final count with its time."""
    import sys

    monkeypatch.setattr(progress, "PROGRESS_DELAY_S", 0.0)
    monkeypatch.setattr(progress, "LOG_REFRESH_S", 0.0)  # every update draws, as a minute-long step would
    with open(tmp_path / "run.log", "w") as log:
        monkeypatch.setattr(sys, "stderr", log)
        with progress.progress_bar(3, "scoring", unit="user") as bar:
            for _ in range(3):
                bar.update(1)
    text = (tmp_path / "run.log").read_text()
    lines = text.splitlines()
    assert "\r" not in text and text.endswith("\n")
    assert [line.split("|")[0].strip() for line in lines[:4]] == ["scoring:   0%", "scoring:  33%", "scoring:  67%",
                                                                   "scoring: 100%"]
    assert all(line.strip() for line in lines) and "3/3" in lines[-1] and "user/s" in lines[-1]


def test_a_step_shorter_than_a_log_files_refresh_writes_nothing_there(monkeypatch, tmp_path):
    import sys

    monkeypatch.setattr(progress, "PROGRESS_DELAY_S", 0.0)
    with open(tmp_path / "run.log", "w") as log:
        monkeypatch.setattr(sys, "stderr", log)
        with progress.progress_bar(3, "scoring") as bar:
            bar.update(3)
    # delay 0 draws the bar once at its start; the minute between drawings then keeps the updates out
    assert (tmp_path / "run.log").read_text().splitlines()[0].startswith("scoring:   0%")
    monkeypatch.setattr(progress, "PROGRESS_DELAY_S", 2.0)  # the suite's delay: a short step writes nothing
    with open(tmp_path / "quiet.log", "w") as log:
        monkeypatch.setattr(sys, "stderr", log)
        with progress.progress_bar(3, "scoring") as bar:
            bar.update(3)
    assert (tmp_path / "quiet.log").read_text() == ""


def test_a_bar_on_a_terminal_redraws_in_place_and_is_cleared_when_done(monkeypatch):
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(progress, "PROGRESS_DELAY_S", 0.0)
    monkeypatch.setattr(sys, "stderr", Terminal())
    with progress.progress_bar(3, "scoring") as bar:
        bar.update(3)
    drawn = sys.stderr.getvalue()
    assert drawn.startswith("\rscoring:") and "\n" not in drawn and drawn.endswith("\r")  # cleared: no line left
