"""What run_all.py's help and smoke outputs tell a newcomer (issue 70): the profiles' costs as the reference files
measured them, the converging profile as the source of numbers to report, and a name for the paper's Table 2."""
import json
import re

import pytest

import run_all
from recbench.benchmarks.commands import cli
from recbench.benchmarks.options import RunOptions
from recbench.reports import console, report, tables
from recbench.reports.results import CONVERGE_ADVICE
from tests.helpers import ROOT

REFERENCE = ROOT / "results" / "reference"


def converge_minutes(model: str) -> list[float]:
    """The training minutes of each seed's converge run of ``model`` on ML-1m, one CPU thread."""
    rows = json.loads((REFERENCE / "converge-ml-1m.json").read_text())["rows"]
    found = [row for row in rows if row["model"] == model and row["protocol"] == "full"]
    assert found and all(row["device"].startswith("cpu (1 thread") for row in found)
    return sorted(row["train_seconds"] / 60 for row in found)


def bert4rec_steps_per_second(path: str, device: str) -> list[float]:
    rows = json.loads((REFERENCE / path).read_text())["rows"]
    return sorted(row["steps_run"] / row["train_seconds"] for row in rows
                  if row["model"] == "bert4rec" and device in row["device"] and row.get("protocol", "full") == "full")


def test_help_and_the_smoke_banner_state_the_costs_the_reference_files_measured(capsys):
    with pytest.raises(SystemExit):
        run_all.parse_args(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    bprmf, sasrec, bert4rec = (converge_minutes(model) for model in ("bprmf", "sasrec", "bert4rec"))
    ranges = [f"{bprmf[0]:.0f}-{bprmf[-1]:.1f} min", f"{sasrec[0] / 60:.1f}-{sasrec[-1] / 60:.1f} h",
              f"{bert4rec[0] / 60:.1f}-{bert4rec[-1] / 60:.1f} h"]
    assert ranges == ["1-1.4 min", "0.7-1.2 h", "4.2-5.3 h"]
    for text in (shown, CONVERGE_ADVICE):
        assert all(figure in text for figure in ranges), text
    cpu = bert4rec_steps_per_second("converge-ml-1m.json", "cpu (1 thread")
    h200 = bert4rec_steps_per_second("rows-ablation-ml-1m-dropout.json", "H200")
    assert f"about {400_000 / cpu[0] / 86400:.1f} days at the {cpu[0]:.2f} steps/s of one CPU thread" in shown
    assert (f"{400_000 / h200[-1] / 3600:.1f}-{400_000 / h200[0] / 3600:.1f} h at the {h200[0]:.0f}-{h200[-1]:.0f} "
            f"steps/s of one H200") in shown


def test_no_smoke_output_recommends_the_paper_profile():
    """The paper profile is weeks of CPU training; the numbers reported come from the converging one."""
    for text in (console.SMOKE_NOTE, CONVERGE_ADVICE):
        assert "`--profile converge`" in text and "--profile paper" not in text
    for module in (console, report, tables):
        source = open(module.__file__).read()
        assert not re.search(r"--profile paper` for|paper profile gives", source), module.__name__


def test_table2_names_the_papers_models_and_all_is_refused_in_one_line(tmp_path, capsys):
    args = run_all.parse_args(["--models", "table2", "sasrec", "--output", str(tmp_path)])
    assert args.models == ["pop", "bprmf", "ncf", "fpmc", "gru4rec", "gru4rec+", "caser", "sasrec", "bert4rec"]
    with pytest.raises(SystemExit) as exited:
        run_all.parse_args(["--models", "all", "--output", str(tmp_path)])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert exited.value.code == 2 and error.split(": error: ", 1)[1].startswith("--models all: the suite has no set of")
    assert "table2, the paper's Table 2 (pop bprmf ncf fpmc gru4rec gru4rec+ caser sasrec bert4rec)" in error


@pytest.mark.parametrize("load, jobs, threads", [(0.2, 1, 2), (1.0, 1, 1), (0.0, 2, 1), (2.0, 1, 1), (5.0, 1, 1)])
def test_the_threads_fit_the_free_cores_and_the_first_line_says_so(load, jobs, threads, tmp_path, capsys,
                                                                  monkeypatch):
    """Issue 70: beside one busy core, two threads that wait for each other made the default run 10× slower."""
    monkeypatch.setattr(cli, "cpu_threads", lambda: 2)
    monkeypatch.setattr(cli.os, "getloadavg", lambda: (load, 0.0, 0.0))
    assert run_all.main(["--dry-run", "--models", "pop", "--jobs", str(jobs), "--output", str(tmp_path)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.endswith(f"; {threads} CPU thread(s) per job: 2 core(s), {min(load, 2.0):.1f} busy by the "
                          f"1-minute load average (--threads N to choose)")


def test_a_resume_takes_the_thread_count_of_the_folders_rows_and_threads_given_stay(tmp_path, monkeypatch):
    monkeypatch.setattr(cli.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    (tmp_path / "results.jsonl").write_text("".join(
        json.dumps({"key": str(n), "protocol": "full", "device": device}) + "\n"
        for n, device in enumerate(["cpu (1 thread, AMD EPYC)", "cpu (1 thread, AMD EPYC)", "cpu (2 threads, x)",
                                    "cuda (NVIDIA H200)"])))

    def chosen(*argv):
        args = run_all.parse_args(["--output", str(tmp_path), *argv])
        return cli.choose_threads(args), args.threads

    assert chosen("--resume") == ("1 CPU thread(s) per job, the count this folder's rows were trained with "
                                  "(--threads N to choose another)", 1)
    assert chosen("--resume", "--threads", "2") == ("2 CPU thread(s) per job (--threads)", 2)
    assert chosen()[1] == cli.cpu_threads()  # not a resume: the free cores, all of them at load 0


def test_a_dry_run_and_an_estimate_on_a_busy_machine_say_what_that_does_to_their_figures(tmp_path, capsys,
                                                                                       monkeypatch):
    monkeypatch.setattr(cli, "cpu_threads", lambda: 2)
    monkeypatch.setattr(cli.os, "getloadavg", lambda: (1.0, 0.0, 0.0))
    assert run_all.main(["--dry-run", "--models", "pop", "--output", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[1] == (
        "note: the machine is busy (1.0 of 2 core(s) by the 1-minute load average): each job gets 1 CPU thread(s) x "
        "1 job(s) at once, and other work slows its training.")
    options = RunOptions(output=tmp_path, device="cpu", threads=1)
    assert cli.busy_note(options, estimate=True).endswith(
        "--estimate times its steps beside that work: its figures hold while the work goes on and overstate the time "
        "once it ends (rerun it then).")
    monkeypatch.setattr(cli.os, "getloadavg", lambda: (0.3, 0.0, 0.0))
    assert cli.busy_note(options, estimate=True) is None


def test_a_second_run_into_a_folder_another_run_is_filling_is_refused_naming_it_or_shares_it_with_resume(
        tmp_path, capsys):
    """Issue 70: two identical runs into one folder without --resume both trained every job, without a word."""
    from recbench.benchmarks.store import ResultStore

    argv = ["--models", "pop", "--output", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"),
            "--quiet", "--no-report", "--threads", "1"]
    store = ResultStore(tmp_path / "out")
    with store.filling("pid 4242 on host since 2026-12-07T10:00:00+00:00: python run_all.py"):
        assert run_all.main(argv) == cli.EXIT_USAGE
        assert capsys.readouterr().err.strip() == (
            f"error: {tmp_path / 'out'} is being filled by another run (pid 4242 on host since "
            f"2026-12-07T10:00:00+00:00: python run_all.py); wait for it to end, add --resume to share the folder "
            f"(each job then trains once), or choose another --output")
        assert run_all.main([*argv, "--resume"]) == 0
        assert "note: another run is filling" in capsys.readouterr().out
    assert store.others_filling() == [] and run_all.main(argv) == 0  # its lock gone with it
    (tmp_path / "out" / "running").mkdir()
    (tmp_path / "out" / "running" / "host-1.lock").write_text("pid 1: killed before it could remove this")
    assert store.others_filling() == [] and not (tmp_path / "out" / "running" / "host-1.lock").exists()


def test_the_estimate_gives_the_peak_memory_beside_the_time_and_warns_when_the_machine_has_less(
        tmp_path, capsys, monkeypatch):
    """Issue 70: a memory estimate beside the time estimate (RAM on the CPU, GPU memory on CUDA), from the steps."""
    from recbench.benchmarks import estimate

    argv = ["--dry-run", "--estimate", "--models", "pop", "bprmf", "--output", str(tmp_path), "--threads", "1"]
    assert run_all.main(argv) == 0
    out = capsys.readouterr().out
    (job,) = [line for line in out.splitlines() if "estimated training:" in line and "no training" not in line]
    peak = float(re.search(r"; peak RAM ≈ (\d+) MiB$", job).group(1))
    assert 50 < peak < 8192  # this process with torch and the data: hundreds of MiB
    assert f"estimated peak RAM while training: ≈ {peak:.0f} MiB for the largest job, of the " in out
    assert "warning: that is more RAM" not in out
    monkeypatch.setattr(estimate, "machine_memory_mb", lambda device: 10.0)
    assert run_all.main(argv) == 0
    assert ("warning: that is more RAM than this machine has: run fewer jobs at once (--jobs) or smaller settings "
            "(batch_size, max_len), or expect swapping or an out-of-memory failure") in capsys.readouterr().out


def test_jobs_at_once_add_their_peaks():
    from recbench.benchmarks.estimate import Estimate, memory_lines

    estimates = {key: Estimate(10.0, memory_mb=mb, memory_kind="GPU memory", memory_limit_mb=2048.0)
                 for key, mb in (("a", 900.0), ("b", 1200.0), ("c", 100.0))}
    assert memory_lines(estimates, 1)[0].startswith("estimated peak GPU memory while training: ≈ 1.2 GiB for the "
                                                    "largest job, of the 2.0 GiB this machine has")
    two = memory_lines(estimates, 2)
    assert ", ≈ 2.1 GiB for 2 jobs at once" in two[0] and two[1].startswith("warning: that is more GPU memory")
