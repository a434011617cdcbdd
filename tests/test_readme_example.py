"""README.md, "Bring your own model", run as written: its model file and settings are saved where it says (a
package outside the checkout, under a temporary home folder) and its shell commands run from the checkout."""
import os
import re
import subprocess
import sys
from pathlib import Path

from recbench.benchmarks.store import read_results
from tests.helpers import ROOT

BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)
SAVED_AS = re.compile(r"save\s+this\s+as\s+`([^`]+)`:\s*$", re.I)


def section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"## {title}\n")
    return text[start:text.index("\n## ", start + 1)]


def test_the_bring_your_own_model_example_runs_as_written(tmp_path):
    """Each block the text says to save is saved there; each shell block runs; the model passes check_model and
    lands beside the baselines in the results and the report."""
    text, saved, commands = section("Bring your own model"), [], []
    for block in BLOCK.finditer(text):
        language, body = block.groups()
        target = SAVED_AS.search(text[:block.start()].rstrip("\n"))
        if language == "bash":
            commands.append(body)
        elif target is not None and target.end() == len(text[:block.start()].rstrip("\n")):
            saved.append(target.group(1))
            path = tmp_path / target.group(1).removeprefix("~/")
            assert path.parent.is_dir(), f"{path.parent}: the README's commands should have made it"
            path.write_text(body)
        if language == "bash" and len(commands) == 1:  # the folder exists before anything is saved into it
            subprocess.run(["bash", "-ec", body], env={**os.environ, "HOME": str(tmp_path)}, check=True, cwd=ROOT)
    assert saved == ["~/myrecs/mypkg/mymodel.py", "~/myrecs/mypkg/mymodel.toml"] and len(commands) == 2
    # `python` is the Python this suite is installed in, as after the README's set-up.
    env = {**os.environ, "HOME": str(tmp_path), "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(["bash", "-ec", commands[1]], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every check passed" in done.stdout and "FAIL" not in done.stdout
    rows = read_results(tmp_path / "myrecs" / "results" / "results.jsonl")
    assert sorted({row["model"] for row in rows}) == ["bprmf", "mypkg.mymodel:MyRec", "pop"]
    mine = next(row for row in rows if row["model"] == "mypkg.mymodel:MyRec")
    assert mine["model_source"]["file"] == str(tmp_path / "myrecs" / "mypkg" / "mymodel.py")
    assert mine["train_settings"]["lr"] == 1e-2 and mine["epochs_run"] == 3  # its TOML, smoke profile
    assert "mypkg.mymodel:MyRec" in (tmp_path / "myrecs" / "results" / "report.md").read_text()
