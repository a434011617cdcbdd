"""benchmarks/EXTENDING.md, "Bring your own model", run as written: its model file and settings are saved where it
says (a package outside the checkout, under a temporary home folder) and its shell commands run from the checkout."""
import os
import subprocess
import sys
from pathlib import Path

from recbench.benchmarks.store import read_results
from tests.helpers import ROOT, readme_blocks


def test_the_bring_your_own_model_example_runs_as_written(tmp_path):
    """Each block the text says to save is saved there; each shell block runs, in one shell as a reader's session;
    both models, the trained and the fitted one, pass check_model and land beside the baselines in the results and
    the report."""
    saved, commands = [], []
    for language, body, target in readme_blocks("Bring your own model"):
        if language == "bash":
            commands.append(body)
        elif target is not None:
            saved.append(target)
            path = tmp_path / target.removeprefix("~/")
            assert path.parent.is_dir(), f"{path.parent}: the README's commands should have made it"
            path.write_text(body)
        if language == "bash" and len(commands) == 1:  # the folder exists before anything is saved into it
            subprocess.run(["bash", "-ec", body], env={**os.environ, "HOME": str(tmp_path)}, check=True, cwd=ROOT)
    assert saved == ["~/myrecs/mypkg/mymodel.py", "~/myrecs/mypkg/mymodel.toml", "~/myrecs/mypkg/itemknn.py"]
    assert len(commands) == 3
    # `python` is the Python this suite is installed in, as after the README's set-up.
    env = {**os.environ, "HOME": str(tmp_path), "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(["bash", "-ec", commands[1] + commands[2]], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("every check passed") == 2 and "FAIL" not in done.stdout
    rows = read_results(tmp_path / "myrecs" / "results" / "results.jsonl")
    assert sorted({row["model"] for row in rows}) == ["bprmf", "mypkg.itemknn:ItemKNN", "mypkg.mymodel:MyRec", "pop"]
    mine = next(row for row in rows if row["model"] == "mypkg.mymodel:MyRec")
    assert mine["model_source"]["file"] == str(tmp_path / "myrecs" / "mypkg" / "mymodel.py")
    assert mine["train_settings"]["lr"] == 1e-2 and mine["epochs_run"] == 3  # its TOML, smoke profile
    fitted = [row for row in rows if row["model"] == "mypkg.itemknn:ItemKNN"]
    assert len(fitted) == 2 and all(row["train_settings"] is None for row in fitted)  # fitted, not trained
    pop = next(row for row in rows if row["model"] == "pop" and row["protocol"] == "full")
    assert next(row for row in fitted if row["protocol"] == "full")["metrics"]["NDCG@10"] > pop["metrics"]["NDCG@10"]
    assert "--resume" in commands[2] and "already in results.jsonl" in done.stdout  # the first run's jobs kept
    report = (tmp_path / "myrecs" / "results" / "report.md").read_text()
    assert "mypkg.mymodel:MyRec" in report and "mypkg.itemknn:ItemKNN" in report
