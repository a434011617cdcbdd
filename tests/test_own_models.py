"""A model of the user's own, run against the baselines without a file of the suite changed (issue 20): an import
path or an entry point beside the registered names; its settings from its Config, a TOML beside its module,
--config and --set; run with --jobs 2, through the Python API and on a Dask cluster; resumed, rerun after its
source changes, and reported. Each model is written by the test into a package outside the checkout."""
import dataclasses
import importlib
import inspect
import json
import os
import pydoc
import socket
import subprocess
import sys
from dataclasses import dataclass

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import run_all
from recbench.benchmarks import studies
from recbench.benchmarks.api import run
from recbench.benchmarks.jobs import GridError
from recbench.benchmarks.options import RunOptions
from recbench.benchmarks.store import read_results
from recbench.datasets import generate
from recbench.models import model_names
from recbench.models.base import NeuralRecommender, gather_candidates
from tests.helpers import OWN_MODEL, ROOT, SMOKE_TOML, write_package

pytestmark = pytest.mark.usefixtures("one_thread")


def cli(tmp_path, argv, capsys) -> tuple[int, str, str]:
    """run_all.main in this process, exit code and output; usage errors (argparse) give code 2."""
    try:
        code = run_all.main([*argv, "--cache-dir", str(tmp_path / "cache"), "--quiet", "--no-report"])
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def log_frame(n_users=150, n_items=200) -> pd.DataFrame:
    """A small interaction log as a DataFrame: user, item, time."""
    data = generate(n_users, n_items, 10.0, seed=3)
    return pd.DataFrame([(user, int(item), t) for user in range(data.n_users)
                         for t, item in enumerate(data.sequence(user))], columns=["user", "item", "time"])


# ------------------------------------------------------------------------------------ the command line

def test_run_all_with_two_jobs_resumes_reruns_after_an_edit_and_reports_the_model(tmp_path):
    """``python run_all.py --datasets synthetic --models pop mypkg.mymodel:MyRec`` with mypkg on PYTHONPATH, in two
    worker processes; then from the folder that holds mypkg (no PYTHONPATH) with --resume, before and after an
    edit of the model's source."""
    folder = write_package(tmp_path / "user", "mypkg", {"mymodel.py": OWN_MODEL, "mymodel.toml": SMOKE_TOML})
    output = tmp_path / "out"
    argv = [sys.executable, str(ROOT / "run_all.py"), "--datasets", "synthetic", "--models", "pop",
            "mypkg.mymodel:MyRec", "--output", str(output), "--jobs", "2", "--threads", "1", "--quiet"]
    env = {**os.environ, "RECBENCH_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)

    def run_all_py(cwd, **extra):
        done = subprocess.run(argv + list(extra.get("more", ())), cwd=cwd, env={**env, **extra.get("env", {})},
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    run_all_py(ROOT, env={"PYTHONPATH": str(tmp_path / "user")})
    rows = read_results(output / "results.jsonl")
    mine = [row for row in rows if row["model"] == "mypkg.mymodel:MyRec"]
    assert len(mine) == 2 and len(rows) == 4  # full and pop100 each
    source = mine[0]["model_source"]
    assert source["file"] == str(folder / "mymodel.py") and source["import_path"] == "mypkg.mymodel:MyRec"
    assert source["commit"] is None and mine[0]["hyperparameters"] == {"hidden": 12, "window": 2}
    assert mine[0]["epochs_run"] == 2 and mine[0]["train_settings"]["lr"] == 1e-2  # its TOML, smoke profile
    report = (output / "report.md").read_text()
    assert "mypkg.mymodel:MyRec" in report.split("## Tables")[1]  # a column of the tables
    assert f"`mypkg.mymodel:MyRec`: `{folder / 'mymodel.py'}`, sha256 `{source['sha256'][:12]}`" in report

    out = run_all_py(tmp_path / "user", more=["--resume"])  # imported from the current directory
    assert out.count("already in results.jsonl") == 2

    (folder / "mymodel.py").write_text(OWN_MODEL + "\n# edited: any change of the source is a new job\n")
    out = run_all_py(tmp_path / "user", more=["--resume"])
    assert "synthetic/pop/seed0: already in results.jsonl" in out and out.count("already in results.jsonl") == 1
    rows = read_results(output / "results.jsonl")
    mine = [row for row in rows if row["model"] == "mypkg.mymodel:MyRec"]
    assert len(mine) == 4 and len({row["key"] for row in mine}) == 2  # the old result stays beside the new
    assert len({row["model_source"]["sha256"] for row in mine}) == 2
    assert "model source sha256: " in (output / "report.md").read_text()  # the report names what changed


def test_settings_come_from_config_toml_config_files_and_set_by_path_or_class_name(own, tmp_path, capsys):
    argv = ["--models", own.model, "--dry-run", "--output", str(tmp_path / "out")]
    code, out, _ = cli(tmp_path, argv, capsys)
    assert code == 0 and "model: hidden=12 window=2" in out and "max_epochs=2" in out and "lr=0.01" in out
    overlay = tmp_path / "more.toml"
    overlay.write_text(f'["{own.model}".model]\nwindow = 4\n')
    code, out, _ = cli(tmp_path, [*argv, "--config", str(overlay), "--set", "MyRec:hidden=20"], capsys)
    assert code == 0 and "model: hidden=20 window=4" in out
    code, out, _ = cli(tmp_path, [*argv, "--set", f"{own.model}:lr=0.5"], capsys)
    assert code == 0 and "lr=0.5" in out
    code, _, err = cli(tmp_path, [*argv, "--set", "MyRec:hiden=3"], capsys)
    assert code == 2 and err.count("\n") == 1 and "unknown field 'hiden'; expected one of batch_size," in err
    assert " hidden, " in err
    code, _, err = cli(tmp_path, [*argv, "--set", "MyRec:hidden='big'"], capsys)
    assert code == 2 and err.strip() == f"error: {own.model}: hidden='big' must be an integer"
    (own.folder / "mymodel.toml").write_text("[model]\nhiden = 3\n")
    code, _, err = cli(tmp_path, argv, capsys)
    assert code == 2 and f"{own.folder / 'mymodel.toml'}: [model]: unknown field 'hiden'" in err


def test_a_short_name_that_fits_two_models_is_refused(own, tmp_path, capsys):
    other = write_package(own.root, f"{own.package}_b", {"mymodel.py": OWN_MODEL})
    second = f"{other.name}.mymodel:MyRec"
    code, _, err = cli(tmp_path, ["--models", own.model, second, "--set", "MyRec:hidden=3", "--dry-run",
                                  "--output", str(tmp_path / "out")], capsys)
    assert code == 2 and "'MyRec' names 2 selected models" in err and "write the import path instead" in err


@pytest.mark.parametrize("name, message", [
    ("nosuchpackage.mod:MyRec", "model 'nosuchpackage.mod:MyRec': cannot import nosuchpackage.mod (No module named "
                                "'nosuchpackage'); put the folder that holds it on PYTHONPATH or run from that folder"),
    ("{package}.mymodel:Missing", "has no Missing"),
    ("{package}.mymodel:Config", "is not a model class; derive it from recbench.models.base.NeuralRecommender"),
    ("nosuchname", "unknown model 'nosuchname'; expected one of pop, "),
])
def test_a_model_that_does_not_resolve_is_a_one_line_usage_error(own, tmp_path, capsys, name, message):
    code, _, err = cli(tmp_path, ["--models", name.format(package=own.package), "--dry-run"], capsys)
    assert code == 2 and message in err.strip().splitlines()[-1]  # one line after argparse's usage


def write_entry_points(root, distribution: str, lines: str) -> None:
    """An installed distribution's metadata, as pip writes it, declaring entry points."""
    info = root / f"{distribution}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[recbench.models]\n{lines}\n")


def test_an_installed_entry_point_is_a_model_name_and_one_that_collides_is_an_error(own, tmp_path, capsys,
                                                                                        monkeypatch):
    write_entry_points(own.root, own.package, f"{own.package}-rec = {own.model}")
    importlib.invalidate_caches()
    assert f"{own.package}-rec" in model_names()
    code, out, _ = cli(tmp_path, ["--models", "pop", f"{own.package}-rec", "--set", f"{own.package}-rec:hidden=8",
                                  "--dry-run", "--output", str(tmp_path / "out")], capsys)
    assert code == 0 and "model: hidden=8 window=2" in out
    clash = tmp_path / "clash"
    write_entry_points(clash, "clashing", f"pop = {own.model}")
    monkeypatch.syspath_prepend(str(clash))
    code, _, err = cli(tmp_path, ["--models", "pop", "--dry-run"], capsys)
    assert code == 2 and err.strip() == (f"error: model 'pop': the entry point of clashing ({own.model}, group "
                                         f"recbench.models) collides with the registered model 'pop'; rename the "
                                         f"entry point")


def test_relevance_task_and_a_study_run_a_model_of_ones_own(own, tmp_path, capsys):
    code, _, err = cli(tmp_path, ["--task", "relevance", "--models", "pop", own.model, "--datasets",
                                  f"tiny={_csv(tmp_path)}", "--output", str(tmp_path / "rel")], capsys)
    assert code == 0, err
    mine = next(row for row in read_results(tmp_path / "rel" / "results.jsonl") if row["model"] == own.model)
    assert mine["task"] == "relevance" and mine["calibration"]["method"] == "platt" and mine["model_source"]
    code = studies.main(["sensitivity", "--datasets", "synthetic", "--models", own.model, "--param", "hidden",
                         "--values", "8", "16", "--dry-run", "--output", str(tmp_path / "study"), "--cache-dir",
                         str(tmp_path / "cache")])
    out = capsys.readouterr().out
    assert code == 0 and "model: hidden=8 window=2" in out and "model: hidden=16 window=2" in out


def _csv(tmp_path):
    path = tmp_path / "tiny.csv"
    log_frame().to_csv(path, index=False)
    return path


def test_rows_name_the_commit_of_the_checkout_the_model_lives_in(own, tmp_path):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "-C", str(own.root)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "my model"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    common = dict(output=tmp_path / "out", settings=["max_epochs=1"], progress=False, cache_dir=tmp_path / "cache",
                  log=lambda *a: None)
    results = run({"tiny": log_frame()}, [own.model], **common)
    assert results["model_source"][0]["commit"] == head
    (own.folder / "mymodel.toml").write_text(SMOKE_TOML + "# an uncommitted edit\n")
    again = run({"tiny": log_frame()}, [own.model], **common)  # the same key (same settings), run again
    assert again["key"][0] == results["key"][0] and again["model_source"][0]["commit"] == f"{head}-dirty"


def test_a_model_in_a_folder_its_checkout_ignores_names_no_commit(own, tmp_path):
    # the enclosing checkout's commit would name other code than the model that ran
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "-C", str(own.root)]
    subprocess.run([*git, "init", "-q"], check=True)
    (own.root / ".gitignore").write_text(f"{own.package}/\n")
    subprocess.run([*git, "add", ".gitignore"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "the model's folder is ignored"], check=True)
    results = run({"tiny": log_frame()}, [own.model], output=tmp_path / "out", settings=["max_epochs=1"],
                  progress=False, cache_dir=tmp_path / "cache", log=lambda *a: None)
    assert results["model_source"][0]["commit"] is None


# --------------------------------------------------------------------------------------- the Python API

API_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])  # the user's folder, as a notebook would add it
from mypkg.mymodel import MyRec
from recbench.benchmarks.api import run

results = run(datasets="synthetic", models=["pop", MyRec], output=sys.argv[2], seeds=[0], n_jobs=2, threads=1,
              protocols=["full"], progress=False, resume=True, log=lambda *args: print(*args))
print(json.dumps({"models": results["model"].tolist(), "keys": results["key"].tolist(),
                  "ndcg": results["NDCG@10"].tolist()}))
"""


def test_the_python_api_runs_a_class_in_two_workers_from_any_directory_and_resumes(tmp_path):
    folder = write_package(tmp_path / "user", "mypkg", {"mymodel.py": OWN_MODEL, "mymodel.toml": SMOKE_TOML})
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "script.py").write_text(API_SCRIPT)
    env = {**os.environ, "RECBENCH_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)

    def script():
        done = subprocess.run([sys.executable, str(tmp_path / "script.py"), str(tmp_path / "user"),
                               str(tmp_path / "out")], cwd=tmp_path / "elsewhere", env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout, json.loads(done.stdout.strip().splitlines()[-1])

    out, first = script()
    assert first["models"] == ["pop", "mypkg.mymodel:MyRec"] and "done [2/2]" in out
    (folder / "mymodel.py").write_text(OWN_MODEL.replace("hidden: int = 16", "hidden: int = 16  # edited"))
    out, edited = script()  # POP's result is resumed, the edited model's is not
    assert "synthetic/pop/seed0: already in results.jsonl" in out and out.count("already in results.jsonl") == 1
    assert edited["keys"][0] == first["keys"][0] and edited["keys"][1] != first["keys"][1]
    assert edited["ndcg"][0] == first["ndcg"][0]


@dataclass
class LocalConfig:
    hidden: int = 8


def test_a_class_no_import_path_reaches_runs_here_only(tmp_path):
    class Local(NeuralRecommender):  # as in a notebook: no module that a worker could import
        Config = LocalConfig

        def __init__(self, n_users, n_items, config):
            super().__init__(n_users, n_items, config)
            self.items = nn.Embedding(n_items + 1, config.hidden)

        def training_examples(self, train):
            return {"items": torch.from_numpy(train.items)}

        def loss(self, batch, generator):
            return F.cross_entropy(self.items(batch["items"]) @ self.items.weight.T, batch["items"])

        def score(self, users, histories, candidates):
            return gather_candidates(self.items.weight.sum(1).expand(len(users), -1), candidates)

    data = {"tiny": log_frame()}
    with pytest.raises(GridError, match="no import path reaches, so worker processes cannot build it; move it into "
                                        "a module on PYTHONPATH"):
        run(data, [Local], output=tmp_path / "out", n_jobs=2, progress=False, log=lambda *a: None)
    results = run(data, [Local], output=tmp_path / "out", settings=["max_epochs=1"], progress=False,
                  cache_dir=tmp_path / "cache", log=lambda *a: None)
    assert results["model"].tolist() == [f"{__name__}:test_a_class_no_import_path_reaches_runs_here_only."
                                         f"<locals>.Local"] * 2
    assert results["model_source"][0]["in_process"] and results["model_source"][0]["file"] == __file__


def test_an_edit_after_import_is_refused_until_the_module_is_reloaded(own, tmp_path):
    module = importlib.import_module(f"{own.package}.mymodel")
    data = {"tiny": log_frame()}
    common = dict(output=tmp_path / "out", settings=["max_epochs=1"], progress=False, cache_dir=tmp_path / "cache",
                  log=lambda *a: None)
    first = run(data, [module.MyRec], **common)
    (own.folder / "mymodel.py").write_text(OWN_MODEL + "\n# edited\n")
    with pytest.raises(GridError, match=f"mymodel.py changed after this process imported it.*importlib.reload"
                                        f"\\({own.package}.mymodel\\)"):
        run(data, [own.model], **common)
    importlib.reload(module)
    second = run(data, [own.model], resume=True, **common)
    assert second["key"][0] != first["key"][0]
    assert second["model_source"][0]["sha256"] != first["model_source"][0]["sha256"]


def test_help_shows_every_parameter_of_run_and_a_wrong_keyword_names_them(tmp_path):
    """Issue 29: help(run) showed ``**options``, and a wrong keyword was RunOptions.__init__()'s TypeError."""
    shown = inspect.signature(run).parameters
    options = {item.name for item in dataclasses.fields(RunOptions)} - {"output", "logs", "command"}
    assert options <= set(shown) and all(shown[name].kind == inspect.Parameter.KEYWORD_ONLY for name in options)
    assert shown["profile"].default == "smoke" and shown["progress"].default is True
    assert all(f"``{name}``" in run.__doc__ for name in shown)  # each explained
    text = pydoc.render_doc(run, renderer=pydoc.plaintext)
    assert "**options" not in text and "n_jobs=1" in text and "``dask_scheduler``" in text
    with pytest.raises(TypeError) as raised:
        run("synthetic", ["pop"], quiet=True, output=tmp_path / "out")
    assert str(raised.value) == f"run(): unknown keyword argument 'quiet'; expected one of {', '.join(shown)}"
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------------------------- Dask

def test_every_dask_worker_must_import_the_model_before_the_grid_starts(own, tmp_path, capsys):
    pytest.importorskip("distributed")
    elsewhere = write_package(tmp_path / "unreachable", f"{own.package}_x", {"mymodel.py": OWN_MODEL})
    sys.path.insert(0, str(tmp_path / "unreachable"))
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{own.root}", "RECBENCH_CACHE_DIR": str(tmp_path / "cache")}
    address, common = f"tcp://127.0.0.1:{port}", ["--no-dashboard", "--host", "127.0.0.1"]
    cluster = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--port", str(port),
                                 *common], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        cluster.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads",
                                         "1", *common], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        from dask.distributed import Client

        with Client(address, timeout="60s") as client:
            client.wait_for_workers(1, timeout=60)
        argv = ["--models", "pop", own.model, "--datasets", f"tiny={_csv(tmp_path)}", "--protocols", "full",
                "--dask-scheduler", address, "--output", str(tmp_path / "out")]
        code, out, err = cli(tmp_path, argv, capsys)
        assert code == 0, err
        mine = [row for row in read_results(tmp_path / "out" / "results.jsonl") if row["model"] == own.model]
        assert len(mine) == 1 and mine[0]["model_source"]["sha256"]
        code, _, err = cli(tmp_path, [*argv[:2], f"{elsewhere.name}.mymodel:MyRec", *argv[3:]], capsys)
        assert code == 2 and f"cannot import model '{elsewhere.name}.mymodel:MyRec'" in err
        assert "start every worker with the folder of each model's package on PYTHONPATH" in err
    finally:
        sys.path.remove(str(tmp_path / "unreachable"))
        for process in cluster:
            process.terminate()
        for process in cluster:
            process.wait(timeout=30)


def test_the_smoke_profile_caps_a_model_of_ones_own_whose_file_sets_no_smoke_epochs(own):
    """Issue 70: without a [smoke.train] max_epochs of its own, a model of one's own trained its default 200 epochs
    under "smoke"; now the smoke cap, unless its file, a --config or --set says otherwise."""
    from recbench.benchmarks.config import SMOKE_MAX_EPOCHS, resolve

    assert resolve(own.model, "synthetic", "smoke").train.max_epochs == 2  # its own smoke table
    (own.folder / "mymodel.toml").write_text(SMOKE_TOML.split("[smoke.train]")[0])
    assert resolve(own.model, "synthetic", "smoke").train.max_epochs == SMOKE_MAX_EPOCHS == 3
    assert resolve(own.model, "synthetic", "smoke", ["max_epochs=7"]).train.max_epochs == 7
    assert resolve(own.model, "synthetic", "smoke", overlays=[
        {own.model: {"smoke": {"train": {"max_epochs": 9}}}}]).train.max_epochs == 9
    assert resolve(own.model, "synthetic", "converge").train.max_epochs == 200  # only the smoke profile is capped
