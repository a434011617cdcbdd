"""``python -m benchmarks.gpu_check``, the user's check of the CUDA path: the CUDA tests of the checkout where torch
sees a GPU, one line and no run where it sees none."""
import subprocess
import sys

from recbench.benchmarks.commands import gpu_check


def test_without_a_gpu_it_says_so_in_one_line_and_runs_nothing(monkeypatch, capsys):
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(gpu_check.subprocess, "run", lambda *args, **kwargs: (_ for _ in ()).throw(AssertionError))
    assert gpu_check.main([]) == 1
    error = capsys.readouterr().err
    assert len(error.strip().splitlines()) == 1 and "sees no CUDA device" in error


def test_with_a_gpu_it_runs_the_cuda_tests_of_the_checkout_with_the_arguments_given(monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_check.torch.cuda, "get_device_name", lambda: "a GPU")
    monkeypatch.setattr(gpu_check.subprocess, "run",
                        lambda command, cwd: ran.append((command, cwd)) or subprocess.CompletedProcess(command, 3))
    assert gpu_check.main(["-x"]) == 3  # pytest's status
    (command, cwd), = ran
    assert command[:5] == [sys.executable, "-m", "pytest", "-m", "cuda"] and "-x" in command
    assert command[-1] == str(gpu_check.ROOT / "tests") and cwd == gpu_check.ROOT
    assert "checking the CUDA path on a GPU" in capsys.readouterr().out


def test_the_cuda_tests_exist_and_are_selected_by_the_mark():
    """The command's pytest line collects the CUDA tests (skipped here, where torch sees no GPU)."""
    done = subprocess.run([*gpu_check.pytest_command(["--collect-only", "-q"])[:-1],
                           str(gpu_check.ROOT / "tests" / "test_cuda.py")],
                          cwd=gpu_check.ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:]
    assert "test_cuda.py::" in done.stdout


def test_the_rehearsals_options_are_refused_in_one_line_that_names_where_it_went(capsys):
    assert gpu_check.main(["--data-dir", "DATA", "--out", "DIR"]) == 2
    error = capsys.readouterr().err
    assert len(error.strip().splitlines()) == 1 and "python -m benchmarks.experiments.gpu_check" in error
