"""The interface check of a model, as scikit-learn's ``check_estimator`` serves estimator authors: one battery of
checks that every model must pass for the harness to train, select and score it correctly.

    python -m recbench.benchmarks.check_model mypkg.mymodel:MyRec          # exits 1 when a check fails
    python -m recbench.benchmarks.check_model mypkg.mymodel:MyRec --slow   # also: does it beat POP?

and from a test of the user's own::

    from recbench.benchmarks.check_model import check_model

    def test_my_model_fits_the_suite():
        check_model(MyRec)  # or "mypkg.mymodel:MyRec"; raises ModelCheckError naming each failure and its fix

The model is planned as a grid plans a job (``benchmarks.planner``: its smoke-profile settings) on a small dataset
in which every user's validation item and test item are ids that appear nowhere else, then run by the worker's own
train-and-test path (``benchmarks.worker.train_and_test``: one epoch of the shared trainer with validation, or its
``fit``; the test pass under each protocol; the attention maps) and its rows and files recorded as the grid records
them, so that a model that passes runs in a grid. The checks that apply to its kind run (a ranker or a model
trained for relevance; trained or not):

- ``interface``: the class resolves, its ``Config`` is a dataclass whose defaults build, its settings resolve,
  the grid plans it, and the worker trains or fits it, tests it and records its rows; what a method returns that
  the harness cannot use (``fit`` without a ``FitReport``, ``loss`` without a scalar, ...) is one line saying what
  to return; every other check needs it;
- ``settings``: each field's default survives ``--set`` (its type is one the suite reads), and an unknown or
  mistyped ``--set`` field is the suite's one-line error;
- ``test item``: neither the validation nor the test item reaches the model before the test pass (training
  examples, histories scored during training and validation, item-indexed buffers, a fitted model's scores),
  and no score depends on which item is held out (the evaluator's validation and test passes give the same
  scores when an item never seen is held out instead: a model that reads the target while it scores does not).
  The changed data is scored in a fresh process that holds only it (the trained model is pickled there, any
  dataset it references replaced by the changed one), so that no path to the real data (the evaluator's frames,
  Python's garbage collector) reaches the real held-out items; where the model cannot be rebuilt there (a class
  defined in a function or a notebook), the ``isolation`` warning says so;
- ``shapes``, ``candidates``, ``factors``, ``batch``, ``padding``: scores have the documented shapes and a
  floating dtype and are finite; candidate scores are the gathered full scores; ``score_factors`` (when given)
  build the same scores; a user's scores depend neither on the other users of the batch (all of the check's
  users, more than any batch size the evaluator fixes, against batches of 32 and of one) nor on how much left
  padding the history has;
- ``checkpoint``: the state_dict of a trained model, saved and loaded into a fresh one, restores its scores;
- ``relevance``: probabilities in [0, 1] with the documented shapes, its own (a model trained for relevance) or
  its calibrated scores' (a ranker, as ``--task relevance`` calibrates it).

A neural model's shapes are checked before it trains (its validation needs them); a fitted model is fitted by the
job before any check scores it, since ``fit`` may build what ``score`` reads. A failure that raised names the
method and line; ``--debug`` (``check_model(..., debug=True)``) adds its traceback.

Warnings do not fail: ``isolation`` (above), ``draws`` (the loss draws from torch's global generator, so a
resumed run's random draws differ from an uninterrupted run's) and, with ``slow``, ``beats POP`` (a smoke-profile
run on the synthetic data against POP).
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import io
import multiprocessing
import os
import pickle
import sys
import sysconfig
import tempfile
import typing
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from traceback import format_exc

import numpy as np
import torch

from recbench.benchmarks.config import ConfigError, ResolvedConfig, check_overrides, resolve, toml_value
from recbench.benchmarks.evaluator import ORDER_BLOCK, Evaluator
from recbench.benchmarks.grid import run_jobs
from recbench.benchmarks.jobs import Job, PlannedJob
from recbench.benchmarks.options import RunOptions
from recbench.benchmarks.planner import plan_grid, prepare_negatives
from recbench.benchmarks.relevance import TASK as RELEVANCE, RelevanceEvaluator, calibrate
from recbench.benchmarks.store import ResultStore
from recbench.benchmarks.worker import JobPayload, train_and_test
from recbench.datasets.sequences import PAD, LeaveOneOutSplit, SequenceData
from recbench.datasets.synthetic import generate
from recbench.models import model_class, model_name_of
from recbench.models.base import InterfaceError, NeuralRecommender, Recommender, wrong_return
from recbench.models.relevance import RelevanceModel

PASSED, FAILED, WARNING, SKIPPED = "passed", "failed", "warning", "skipped"
DATASET = "synthetic"  # whose settings the check's data takes, as the grid would resolve them
N_USERS = ORDER_BLOCK + 44  # more users than any batch size the evaluator fixes (its blocks of 256, attention's 64)
EXTRA_PADDING = 7  # columns of padding added on the left by the padding check
TOLERANCE = dict(rtol=1e-5, atol=1e-5)


@dataclass
class CheckResult:
    check: str
    status: str  # passed, failed, warning or skipped
    message: str = ""  # what is wrong and what to fix (why a check was skipped)
    traceback: str = ""  # where a check raised: the error's traceback (``debug=True``, ``--debug`` show it)


class ModelCheckError(AssertionError):
    """Some checks failed; the message has one line per failure, each saying what to fix."""

    def __init__(self, name: str, results: list[CheckResult], debug: bool = False):
        self.results = results
        failed = [result for result in results if result.status == FAILED]
        super().__init__(f"{name}: {len(failed)} check(s) failed\n"
                         + "\n".join(f"  {result.check}: {result.message}"
                                      + (f"\n{result.traceback}" if debug and result.traceback else "")
                                      for result in failed))


def check_model(model, *, slow: bool = False, raise_on_failure: bool = True, log=None,
                debug: bool = False) -> list[CheckResult]:
    """Run the battery (module docstring) on ``model``: a name ``run_all.py --models`` accepts, or a model class.
    Returns every check's result; with ``raise_on_failure`` a failed check raises :class:`ModelCheckError`, whose
    message holds the traceback of each failure that raised when ``debug`` (each result keeps it in
    ``traceback``). ``log(result)`` is called as each check ends."""
    name = model if isinstance(model, str) else getattr(model, "__qualname__", repr(model))
    results = []
    for result in _battery(model, slow):
        results.append(result)
        if log is not None:
            log(result)
    if raise_on_failure and any(result.status == FAILED for result in results):
        raise ModelCheckError(name, results, debug)
    return results


# ------------------------------------------------------------------------------------------------ the bench

class _Spy:
    """Records what the harness hands a model: every history it scores (and, while :meth:`keeping_outputs`, what
    each call returned) and the training examples it builds. Installed as instance attributes, so that the model's
    own code calls them too. As ``TrainRun.on_validation`` it notes where each validation ended: what it records
    after the last one is the test pass."""

    def __init__(self, model: Recommender):
        self.histories: list[torch.Tensor] = []
        self.validated = 0  # histories recorded when the last validation ended
        self.outputs: list | None = None
        self.examples: dict = {}
        for method, histories_at in (("score", 1), ("score_factors", 1), ("predict_proba", 1),
                                     ("attention_weights", 0)):
            setattr(model, method, self._recording(getattr(model, method), histories_at))
        if isinstance(model, NeuralRecommender):
            original = model.training_examples
            model.training_examples = lambda train: self._keep(original(train))

    def _recording(self, method, histories_at: int):
        def recorded(*args):
            self.histories.append(args[histories_at].detach().cpu())
            returned = method(*args)
            if self.outputs is not None:
                self.outputs.append(_tensors(returned))
            return returned
        return recorded

    def _keep(self, examples):
        if isinstance(examples, dict):
            self.examples = {key: value.detach().cpu() for key, value in examples.items()
                             if isinstance(value, torch.Tensor)}
        return examples

    def __call__(self, validation) -> None:
        self.validated = len(self.histories)

    @contextmanager
    def keeping_outputs(self):
        """What the model returns meanwhile, a list of tensors per call."""
        self.outputs = []
        try:
            yield self.outputs
        finally:
            self.outputs = None


def _tensors(returned) -> list[torch.Tensor]:
    """The tensors of what a model's method returned (a tensor, ScoreFactors, a tuple), detached copies."""
    parts = returned if isinstance(returned, tuple) else (returned,)
    return [part.detach().cpu().clone() for part in parts if isinstance(part, torch.Tensor)]


@dataclass
class _Bench:
    """The model under test, built and run through the worker once, and what the checks score it with."""

    name: str
    cls: type
    config: ResolvedConfig
    data: SequenceData
    split: LeaveOneOutSplit
    model: Recommender | None = None
    spy: _Spy | None = None
    users: torch.Tensor | None = None
    histories: torch.Tensor | None = None
    sentinels: dict = field(default_factory=dict)  # "validation", "test", "never seen" -> item id
    isolation: str | None = None  # why the held-out check could not score in a fresh process (None: it did)

    @property
    def neural(self) -> bool:
        return issubclass(self.cls, NeuralRecommender)

    @property
    def relevance(self) -> bool:
        return issubclass(self.cls, RelevanceModel)

    def scores(self, users=None, histories=None, candidates=None, model=None) -> torch.Tensor:
        model = model or self.model
        with torch.inference_mode():
            return model.score(self.users if users is None else users,
                               self.histories if histories is None else histories, candidates)


def sentinel_data(n_users: int = N_USERS, n_items: int = 200, extra_items: int = 800) -> tuple[SequenceData, dict]:
    """Small synthetic sequences over items 1..n_items, each followed by the same validation item and the same
    test item, two ids that appear nowhere else; a third id appears nowhere at all. The sentinels are the
    largest ids (n_items + extra_items - 2 and on), far above any user id, length or position a model's
    training examples might hold beside item ids."""
    base = generate(n_users, n_items, mean_length=8.0, seed=0, max_length=20)
    total = n_items + extra_items
    sentinels = {"validation": total - 2, "test": total - 1, "never seen": total}
    sequences = [np.r_[base.sequence(user), sentinels["validation"], sentinels["test"]] for user in range(n_users)]
    return SequenceData.from_sequences("check", sequences, n_items=total), sentinels


def held_out_instead(data: SequenceData, position: int, item: int) -> SequenceData:
    """``data`` with every sequence's item at ``position`` (-2: the validation item, -1: the test item) replaced
    by ``item``."""
    items = data.items.copy()
    items[data.offsets[1:] + position] = item
    return SequenceData(data.name, items, data.offsets, data.n_items, data.provenance)


def _bench(name: str) -> tuple[_Bench, PlannedJob]:
    """Resolve the model, plan its job as a grid would (its smoke settings on the check's data, named as the
    synthetic dataset whose settings it takes) and build it, untrained, with the test split's users and
    histories to score (errors here fail the interface check)."""
    cls = model_class(name)
    cls.Config()  # every field has a default, which __post_init__ accepts
    data, sentinels = sentinel_data()
    task = RELEVANCE if issubclass(cls, RelevanceModel) else "next-item"
    options = RunOptions(output=".", protocols=("full", "pop100"), profile="smoke", device="cpu", progress=False)
    (planned,), _ = plan_grid([Job(DATASET, name, 0, task=task)], options, preloaded={DATASET: data},
                              log=lambda *_: None)
    bench = _Bench(name, cls, planned.config, data, LeaveOneOutSplit(data), sentinels=sentinels)
    if not bench.neural and not callable(getattr(cls, "fit", None)):
        raise InterfaceError(f"{cls.__qualname__} neither derives from NeuralRecommender (trained by the suite's "
                             f"trainer) nor defines fit(train) -> FitReport")
    torch.manual_seed(0)
    bench.model = cls(data.n_users, data.n_items, planned.config.model)
    if isinstance(bench.model, torch.nn.Module):
        bench.model.eval()
    if not isinstance(bench.model.history_length, int) or bench.model.history_length < 0:
        raise wrong_return(bench.model, "history_length", bench.model.history_length, "an int >= 0, how many of "
                                                                                     "the latest items score reads")
    view = bench.split.test()
    rows = np.arange(len(view))
    bench.users = torch.from_numpy(view.users[rows])
    bench.histories = torch.from_numpy(view.padded(rows, max(bench.model.history_length, 1)))
    return bench, planned


def _run_as_a_job(bench: _Bench, planned: PlannedJob) -> None:
    """Train the model one epoch with validation (or fit it), test it and record its rows and files, all by the
    worker's own path (``benchmarks.worker.train_and_test``) and the grid's store, with the spy watching."""
    bench.spy = _Spy(bench.model)
    settings = dataclasses.replace(planned.config.train, max_epochs=1, max_steps=None, patience=None,
                                   time_budget_s=None, cpu_budget_s=None, valid_every=1, valid_users=None,
                                   warmup_steps=0)
    planned = dataclasses.replace(planned, config=dataclasses.replace(planned.config, train=settings))
    with tempfile.TemporaryDirectory() as folder:
        store = ResultStore(Path(folder))
        prepare_negatives([planned], {DATASET: bench.data}, Path(folder), log=lambda *_: None)
        payload = JobPayload(planned=planned, device="cpu", threads=None, negatives_dir=str(Path(folder) / "negatives"),
                             checkpoint=str(store.checkpoint(planned.file_stem)), resume=False, keep_weights=True,
                             progress=False, commit="check_model", on_validation=bench.spy)
        rows, files, _ = train_and_test(payload, bench.data, torch.device("cpu"), lambda *_: None, bench.model)
        store.commit(planned.key, rows, files)
    if isinstance(bench.model, torch.nn.Module):
        bench.model.eval()


def _battery(model, slow: bool):
    """Every check's result, in order (a generator, so that a command line can show each as it ends)."""
    try:
        name = model if isinstance(model, str) else model_name_of(model)
        bench, planned = _bench(name)
        shapes = _fitted_job(bench, planned)
    except Exception as error:  # noqa: BLE001  (any failure here is the model's: say what it was)
        yield CheckResult("interface", FAILED, _interface_fix(error), format_exc())
        return
    yield CheckResult("interface", PASSED)
    if shapes is not None:
        yield CheckResult("shapes", FAILED, shapes)
        return
    for check, applies, severity, run in CHECKS:
        if not applies(bench):
            yield CheckResult(check, SKIPPED, "does not apply to this kind of model")
            continue
        trace = ""
        try:
            problem = run(bench)
        except Exception as error:  # noqa: BLE001
            problem, trace = f"raised {_where(error)}", format_exc()
        yield CheckResult(check, severity if problem else PASSED, problem or "", trace)
    if slow:
        yield _beats_pop(name)


def _fitted_job(bench: _Bench, planned: PlannedJob) -> str | None:
    """Run the model as a job (:func:`_run_as_a_job`); a problem with its scores' shapes, or None. A neural
    model's shapes are checked before it trains, since the trainer's validation needs them right; a fitted
    model's only after the job has fitted it (``fit`` may build what ``score`` reads), and when the job fails, a
    shape that is wrong is said in place of the error it caused."""
    if bench.neural:
        shapes = _check_shapes(bench)
        if shapes is None:
            _run_as_a_job(bench, planned)
        return shapes
    try:
        _run_as_a_job(bench, planned)
    except Exception:
        try:
            shapes = _check_shapes(bench)
        except Exception:  # noqa: BLE001  (the job's own error says more)
            shapes = None
        if shapes is None:
            raise
        return shapes
    return _check_shapes(bench)


def _interface_fix(error: Exception) -> str:
    """One line: the harness's own message (a wrong return, a setting, what the grid refuses) as it is, else the
    error, the method and line that raised it, and what the interface asks."""
    if isinstance(error, (InterfaceError, ValueError)):
        return "; ".join(line.strip() for line in str(error).splitlines())
    return (f"{_where(error)} (the model must resolve, its Config() build from defaults, its settings resolve, and "
            f"it must build from (n_users, n_items, config) and train or fit; ARCHITECTURE.md, \"The model "
            f"interface\"; --debug shows the traceback)")


# Where the suite's harness, torch and Python live: a traceback's last frame outside them is the model's own.
_HARNESS = tuple(str(Path(sys.modules[module].__file__).resolve().parent) + os.sep
                 for module in (Evaluator.__module__, SequenceData.__module__, "torch"))
_LIBRARIES = tuple({sysconfig.get_paths()[name] for name in ("stdlib", "platstdlib", "purelib", "platlib")})


def _where(error: BaseException) -> str:
    """``error`` in one line with the method and line that raised it: the last frame of its traceback in the
    model's code (outside the harness, torch and Python), else its last frame."""
    frames = []
    trace = error.__traceback__
    while trace is not None:
        frames.append((trace.tb_frame.f_code, trace.tb_lineno))
        trace = trace.tb_next
    own = [(code, line) for code, line in frames
           if not str(Path(code.co_filename).resolve()).startswith(_HARNESS + _LIBRARIES)
           and not code.co_filename.startswith("<")]
    message = " ".join(str(error).split()) or "(no message)"
    if not (own or frames):
        return f"{type(error).__name__}: {message}"
    code, line = (own or frames)[-1]
    return f"{type(error).__name__}: {message} (in {code.co_qualname}, {Path(code.co_filename).name} line {line})"


# ----------------------------------------------------------------------------------------------- the checks

def _check_settings(bench: _Bench) -> str | None:
    """Every field's default through --set, an unknown field and a mistyped one."""
    name, problems = bench.name, []
    hints = typing.get_type_hints(bench.cls.Config)
    for item in dataclasses.fields(bench.cls.Config):
        text = f"{name}:{item.name}={toml_value(getattr(bench.config.model, item.name))}"
        try:
            check_overrides([text], [name])
            resolve(name, "synthetic", "smoke", [text])
        except (ValueError, TypeError) as error:
            problems.append(f"--set {item.name}=<its value> fails ({error}): annotate each Config field as int, "
                            f"float, bool, str, tuple, or one of them | None")
    wrong = [f"{name}:no_such_field=1"]
    typed = next((item.name for item in dataclasses.fields(bench.cls.Config) if hints[item.name] in (int, float)),
                 None)
    if typed is not None:
        wrong.append(f"{name}:{typed}='abc'")
    for text in wrong:
        try:
            check_overrides([text], [name])
            resolve(name, "synthetic", "smoke", [text])
            problems.append(f"--set {text} was accepted; a wrong --set must be refused before training")
        except ConfigError as error:
            if "\n" in str(error) or ("must" not in str(error) and "unknown field" not in str(error)):
                problems.append(f"--set {text} gave {error!r}, not the suite's one-line error")
    return "; ".join(problems) or None


def _check_test_item(bench: _Bench) -> str | None:
    """The validation and test items never reach the model before its test pass, and no score depends on which
    item is held out."""
    held_out = {bench.sentinels["validation"]: "validation item", bench.sentinels["test"]: "test item"}
    spy, problems = bench.spy, []
    for key, tensor in spy.examples.items():
        for item, what in held_out.items():
            if not torch.is_floating_point(tensor) and bool((tensor == item).any()):
                problems.append(f"training_examples(train) returned the {what} in {key!r}: build the examples "
                                f"from the train view only")
    for histories in spy.histories[:spy.validated]:
        for item, what in held_out.items():
            if bool((histories == item).any()):
                problems.append(f"a history scored during training or validation holds the {what}")
    if any(bool((histories == bench.sentinels["test"]).any()) for histories in spy.histories[spy.validated:]):
        problems.append("a history scored in the test pass holds the test item")
    problems += _leaked_state(bench) + _reads_the_target(bench)
    return "; ".join(dict.fromkeys(problems)) or None


def _reads_the_target(bench: _Bench) -> list[str]:
    """The evaluator's validation and test passes give the model the same users and histories whichever item is
    held out; so its scores must be the same when an item never seen is held out instead of the sentinel. The
    swapped world is scored in a fresh process that holds only the changed data (:func:`_swapped_outputs`), so
    that no path to the data (the evaluator's frames, Python's garbage collector, a module's globals) reaches the
    real held-out items; where the model cannot be carried there, in this process (and the isolation check
    warns)."""
    real = {}
    for split in SWAPS:
        with bench.spy.keeping_outputs() as returned:
            Evaluator(LeaveOneOutSplit(bench.data), seed=0).evaluate(bench.model, split, "full", bench.name)
        real[split] = returned
    swapped = _swapped_outputs(bench)
    if swapped is None:  # scored here, where the real data stays reachable (warned of by the isolation check)
        swapped = {}
        for split, position in SWAPS.items():
            with bench.spy.keeping_outputs() as returned:
                data = held_out_instead(bench.data, position, bench.sentinels["never seen"])
                Evaluator(LeaveOneOutSplit(data), seed=0).evaluate(bench.model, split, "full", bench.name)
            swapped[split] = returned
    changed = [split for split in SWAPS if not _same_outputs(real[split], swapped[split])]
    if not changed:
        return []
    return [f"the scores of the evaluator's {' and '.join(changed)} pass change with the item held out, for the same "
            f"users and histories: the model reads the held-out target while it scores; score from users, "
            f"histories and candidates only"]


SWAPS = {"valid": -2, "test": -1}  # the evaluator's pass -> the position of the item it holds out


class _WorldPickler(pickle.Pickler):
    """Pickles a model with every dataset or split it references left as a placeholder, which the fresh process
    fills with its own (swapped) world: the real data never travels."""

    def persistent_id(self, obj):
        if isinstance(obj, SequenceData):
            return "data"
        if isinstance(obj, LeaveOneOutSplit):
            return "split"
        return None


class _WorldUnpickler(pickle.Unpickler):
    def __init__(self, file, world: dict):
        super().__init__(file)
        self.world = world

    def persistent_load(self, pid):
        return self.world[pid]


def _swapped_outputs(bench: _Bench) -> dict | None:
    """{pass: what the model returned} in the swapped worlds, each scored in a fresh process (forked from a
    server that never held this process's data) given only the model and the changed data, through files; None,
    with ``bench.isolation`` saying why, where the model cannot be carried there (a class defined in a function
    or a notebook). An error of the model's own there is raised here, naming the fresh process."""
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        try:
            with _without_spy(bench.model):
                buffer = io.BytesIO()
                _WorldPickler(buffer).dump(bench.model)
        except Exception as error:  # noqa: BLE001  (a class outside any module, an unpicklable attribute)
            bench.isolation = f"the model cannot be pickled ({type(error).__name__}: {error})"
            return None
        (folder / "model.pkl").write_bytes(buffer.getvalue())
        for split, position in SWAPS.items():
            held_out_instead(bench.data, position, bench.sentinels["never seen"]).save(folder / f"{split}.npz")
        context = multiprocessing.get_context("forkserver" if "forkserver" in multiprocessing.get_all_start_methods()
                                              else "spawn")
        if context.get_start_method() == "forkserver":
            context.set_forkserver_preload(["__main__", __name__])
        try:
            process = context.Process(target=_score_swapped_worlds, args=(str(folder), bench.name), daemon=True)
            process.start()
            process.join()
        except Exception as error:  # noqa: BLE001  (the process could not start: an unguarded __main__ script)
            bench.isolation = f"no fresh process could start ({type(error).__name__}: {error})"
            return None
        outcome = folder / "outcome.pkl"
        if not outcome.is_file():
            bench.isolation = f"the fresh process ended with exit code {process.exitcode} before it scored"
            return None
        status, value = pickle.loads(outcome.read_bytes())
    if status == "unpickled":
        bench.isolation = f"the fresh process cannot rebuild the model ({value})"
        return None
    if status == "raised":
        raise RuntimeError(f"scoring in a fresh process that holds only the data: {value}")
    return value


@contextmanager
def _without_spy(model: Recommender):
    """``model`` without the spy's instance attributes (closures, which do not pickle), put back after."""
    names = [name for name in ("score", "score_factors", "predict_proba", "attention_weights", "training_examples")
             if name in vars(model)]
    kept = {name: vars(model).pop(name) for name in names}
    try:
        yield model
    finally:
        vars(model).update(kept)


def _score_swapped_worlds(folder: str, name: str) -> None:
    """In the fresh process: each swapped world, alone, loaded from its file; the model rebuilt with that world in
    place of the data it referenced; what the evaluator's pass has it return. The outcome goes to a file."""
    folder = Path(folder)
    torch.set_num_threads(1)
    outputs = {}
    try:
        for split in SWAPS:
            data = SequenceData.load(folder / f"{split}.npz")
            world = {"data": data, "split": LeaveOneOutSplit(data)}
            try:
                with open(folder / "model.pkl", "rb") as file:
                    model = _WorldUnpickler(file, world).load()
            except Exception as error:  # noqa: BLE001
                (folder / "outcome.pkl").write_bytes(pickle.dumps(("unpickled", f"{type(error).__name__}: {error}")))
                return
            spy = _Spy(model)
            with spy.keeping_outputs() as returned:
                Evaluator(world["split"], seed=0).evaluate(model, split, "full", name)
            outputs[split] = returned
            del data, world, model, spy
            gc.collect()
    except Exception as error:  # noqa: BLE001  (the model's own error: said with where it was raised)
        (folder / "outcome.pkl").write_bytes(pickle.dumps(("raised", _where(error))))
        return
    (folder / "outcome.pkl").write_bytes(pickle.dumps(("scored", outputs)))


def _same_outputs(one: list, other: list) -> bool:
    return len(one) == len(other) and all(
        len(a) == len(b) and all(x.shape == y.shape and torch.allclose(x.double(), y.double(), **TOLERANCE)
                                 for x, y in zip(a, b)) for a, b in zip(one, other))


def _leaked_state(bench: _Bench) -> list[str]:
    """What the fitted model knows of the test item: item-indexed buffers, or a fitted model's scores, that
    treat it unlike an item never seen."""
    test, unseen = bench.sentinels["test"], bench.sentinels["never seen"]
    problems = []
    if isinstance(bench.model, torch.nn.Module):
        for key, buffer in bench.model.named_buffers():
            if buffer.dim() == 1 and len(buffer) > unseen and buffer[test] != buffer[unseen]:
                problems.append(f"buffer {key!r} holds a value for the test item unlike for an item never seen: "
                                f"compute it from the train view only")
    if not bench.neural:
        scores = bench.scores(histories=torch.from_numpy(
            bench.split.valid().padded(np.arange(len(bench.users)), bench.histories.shape[1])))
        if not torch.equal(scores[:, test], scores[:, unseen]):
            problems.append("after fit(train) the test item scores unlike an item never seen: fit on the train "
                            "view only")
    return problems


def _check_shapes(bench: _Bench) -> str | None:
    full = bench.scores()
    rows, slots = len(bench.users), bench.split.n_items + 1
    if tuple(full.shape) != (rows, slots):
        return (f"score(users, histories, None) returned shape {tuple(full.shape)}, expected {(rows, slots)}: one "
                f"score per item id, column 0 (padding) included")
    if not torch.is_floating_point(full):
        return f"scores are {full.dtype}; return floating-point scores"
    if not torch.isfinite(full[:, 1:]).all():
        return "scores hold NaN or inf; the evaluator refuses them"
    candidates = _candidates(bench)
    some = bench.scores(candidates=candidates)
    if tuple(some.shape) != tuple(candidates.shape) or not torch.is_floating_point(some):
        return (f"score(users, histories, candidates {tuple(candidates.shape)}) returned {tuple(some.shape)} "
                f"{some.dtype}; return one floating-point score per candidate")
    return None


def _candidates(bench: _Bench) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(1, bench.split.n_items + 1, (len(bench.users), 9), generator=generator)


def _check_candidates(bench: _Bench) -> str | None:
    candidates = _candidates(bench)
    gathered, some = bench.scores().gather(1, candidates), bench.scores(candidates=candidates)
    if not torch.allclose(some.float(), gathered.float(), **TOLERANCE):
        return (f"candidate scores differ from the full scores gathered at the same ids (largest difference "
                f"{_gap(some, gathered)}): score each candidate as in the full ranking, e.g. "
                f"gather_candidates(full_scores, candidates) (models.base)")
    return None


def _check_factors(bench: _Bench) -> str | None:
    with torch.inference_mode():
        product = bench.model.score_factors(bench.users, bench.histories).full()
    full = bench.scores()
    if not torch.allclose(product.float(), full.float(), **TOLERANCE):
        return (f"score_factors(...).full() differs from score(..., None) (largest difference "
                f"{_gap(product, full)}); the evaluator ranks with the factors on the CPU, so they must give the "
                f"same scores")
    return None


def _has_factors(bench: _Bench) -> bool:
    with torch.inference_mode():
        return bench.model.score_factors(bench.users[:2], bench.histories[:2]) is not None


def _check_batch(bench: _Bench) -> str | None:
    """Every user in one batch (more users than any batch size the evaluator fixes), in reverse order, in
    batches of 32 and alone."""
    together, n = bench.scores(), len(bench.users)
    order = torch.arange(n - 1, -1, -1)
    reversed_ = bench.scores(bench.users[order], bench.histories[order])[order]
    by_32 = torch.cat([bench.scores(bench.users[i:i + 32], bench.histories[i:i + 32]) for i in range(0, n, 32)])
    alone = torch.cat([bench.scores(bench.users[i:i + 1], bench.histories[i:i + 1]) for i in (0, 5, 17)])
    if not all(torch.allclose(scores, expected, **TOLERANCE) for scores, expected in
               ((reversed_, together), (by_32, together), (alone, together[[0, 5, 17]]))):
        return (f"a user's scores change with the other users of the batch or their order ({n} users at once "
                f"against batches of 32 and of one): score each user on its own (no statistics across the batch at "
                f"evaluation; the evaluator chunks users freely)")
    return None


def _check_padding(bench: _Bench) -> str | None:
    wider = torch.cat([torch.full((len(bench.users), EXTRA_PADDING), PAD), bench.histories], 1)
    together, padded = bench.scores(), bench.scores(histories=wider)
    if not torch.allclose(padded, together, **TOLERANCE):
        return (f"scores change with {EXTRA_PADDING} more columns of left padding (largest difference "
                f"{_gap(padded, together)}): histories are left-padded with 0 to any width of at least "
                f"history_length; leave padding out (mask item id 0, e.g. multiply its embeddings by "
                f"(histories > 0)) or read only the last history_length columns")
    return None


def _check_checkpoint(bench: _Bench) -> str | None:
    buffer = io.BytesIO()
    torch.save(bench.model.state_dict(), buffer)
    torch.manual_seed(1)
    fresh = bench.cls(bench.split.data.n_users, bench.split.n_items, bench.config.model)
    fresh.training_examples(bench.split.train())  # as the trainer does before it loads a checkpoint
    buffer.seek(0)
    fresh.load_state_dict(torch.load(buffer, weights_only=True))
    fresh.eval()
    restored, scores = bench.scores(model=fresh), bench.scores()
    if not torch.allclose(restored, scores, **TOLERANCE):
        return (f"a fresh model loaded with the trained state_dict scores differently (largest difference "
                f"{_gap(restored, scores)}): keep every learned tensor in a parameter or a registered buffer "
                f"(register_buffer), so that checkpoints and resumed runs restore it")
    return None


def _check_relevance(bench: _Bench) -> str | None:
    pairs = RelevanceEvaluator(bench.split, seed=0)
    scorer = bench.model if bench.relevance else calibrate(bench.model, pairs, bench.name)
    candidates = _candidates(bench)
    wider = torch.cat([torch.full((len(bench.users), EXTRA_PADDING), PAD), bench.histories], 1)
    with torch.inference_mode():
        several = scorer.predict_proba(bench.users, bench.histories, candidates)
        one = scorer.predict_proba(bench.users, bench.histories, candidates[:, 0])
        padded = scorer.predict_proba(bench.users, wider, candidates)
    if tuple(several.shape) != tuple(candidates.shape) or tuple(one.shape) != (len(bench.users),):
        return (f"predict_proba returned {tuple(several.shape)} for candidates {tuple(candidates.shape)} and "
                f"{tuple(one.shape)} for {(len(bench.users),)}; return one probability per candidate")
    if not (torch.isfinite(several).all() and (several >= 0).all() and (several <= 1).all()):
        return "probabilities must be finite and in [0, 1]"
    if not torch.allclose(one.double(), several[:, 0].double(), **TOLERANCE):
        return "a candidate's probability changes with the other candidates scored beside it"
    if bench.relevance and not torch.allclose(padded.double(), several.double(), **TOLERANCE):
        return "probabilities change with more left padding of the histories"  # a ranker's: the padding check
    return None


def _check_draws(bench: _Bench) -> str | None:
    examples = bench.model.training_examples(bench.split.train())
    batch = {key: value[:32] for key, value in examples.items()}
    bench.model.train()
    losses = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        losses.append(bench.model.loss(batch, torch.Generator().manual_seed(7)).detach())
    bench.model.eval()
    if not torch.equal(losses[0], losses[1]):
        return ("the loss draws random numbers from torch's global generator (e.g. nn.Dropout), not only from its "
                "generator argument: runs still repeat from the job's seed, but a resumed run's draws differ from "
                "an uninterrupted run's; draw from the generator argument, e.g. "
                "recbench.models.sampling.dropout(x, p, generator) in place of nn.Dropout")
    return None


def _isolation_warning(why: str) -> str:
    return (f"the held-out check scored the swapped data in this process, where the real data stays reachable "
            f"(a model that finds it, e.g. through the garbage collector, would pass): {why}; define the model in "
            f"a module a fresh process can import, with `if __name__ == \"__main__\":` around a script's own code")


def _gap(a: torch.Tensor, b: torch.Tensor) -> str:
    return f"{float((a.double() - b.double()).abs().max()):.3g}"


def _always(bench: _Bench) -> bool:
    return True


CHECKS = (  # (name, applies to the bench, severity when it finds a problem, the check)
    ("settings", _always, FAILED, _check_settings),
    ("test item", _always, FAILED, _check_test_item),
    ("isolation", _always, WARNING, lambda bench: bench.isolation and _isolation_warning(bench.isolation)),
    ("shapes", _always, FAILED, _check_shapes),
    ("candidates", _always, FAILED, _check_candidates),
    ("factors", _has_factors, FAILED, _check_factors),
    ("batch", _always, FAILED, _check_batch),
    ("padding", _always, FAILED, _check_padding),
    ("checkpoint", lambda bench: bench.neural, FAILED, _check_checkpoint),
    ("relevance", _always, FAILED, _check_relevance),
    ("draws", lambda bench: bench.neural, WARNING, _check_draws),
)


# ------------------------------------------------------------------------------------------ the slow check

def _beats_pop(name: str) -> CheckResult:
    """A smoke-profile run of the model and POP on the synthetic data, as ``run_all.py`` runs them."""
    relevance = issubclass(model_class(name), RelevanceModel)
    task, metric = ("relevance", "AUC") if relevance else ("next-item", "NDCG@10")
    with tempfile.TemporaryDirectory() as folder:
        options = RunOptions(output=folder, protocols=("full",), profile="smoke", cache_dir=folder, device="cpu",
                             progress=False)
        try:
            result = run_jobs([Job("synthetic", model, 0, task=task) for model in ("pop", name)], options,
                              log=lambda *_: None)
        except Exception as error:  # noqa: BLE001
            return CheckResult("beats POP", WARNING, f"the smoke run failed: {error}")
    if result.failed:
        return CheckResult("beats POP", WARNING, f"the smoke run failed: {result.failed[0].error}")
    value = {row["model"]: row["metrics"][metric] for row in result.rows}
    if value[name] <= value["pop"]:
        return CheckResult("beats POP", WARNING, f"after its smoke-profile training on the synthetic data, {metric} "
                                                 f"{value[name]:.4f} is not above POP's {value['pop']:.4f}: it may "
                                                 f"learn too little in the smoke budget, or not at all")
    return CheckResult("beats POP", PASSED, f"{metric} {value[name]:.4f} against POP's {value['pop']:.4f}")


# ------------------------------------------------------------------------------------------- command line

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recbench.benchmarks.check_model", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", metavar="MODEL",
                        help="a registered name, an entry point, or package.module:Class")
    parser.add_argument("--slow", action="store_true", help="also train on the synthetic data against POP")
    parser.add_argument("--debug", action="store_true", help="show the traceback of each failure that raised")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # tiny models: threads only add overhead
    results = []
    for name in args.models:
        print(f"{name}:")
        results += check_model(name, slow=args.slow, raise_on_failure=False,
                               log=lambda result: _show(result, args.debug))
    failed, warnings = (sum(result.status == status for result in results) for status in (FAILED, WARNING))
    print(f"{failed} check(s) failed" if failed else "every check passed",
          f"({warnings} warning(s))" if warnings else "")
    return 1 if failed else 0


def _show(result: CheckResult, debug: bool = False) -> None:
    label = {PASSED: "pass", FAILED: "FAIL", WARNING: "warn", SKIPPED: "skip"}[result.status]
    print(f"  {label}  {result.check}" + (f": {result.message}" if result.message else ""), flush=True)
    if debug and result.traceback:
        print(result.traceback, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
