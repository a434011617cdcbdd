"""What a training run shows while it runs: a bar where bars redraw in place (a terminal, a notebook), else a line
an epoch in a log, with the epoch against its cap, the loss, the best validation value, how close early stopping is,
the budgets, and the time left where the run's end is known (:class:`TrainingProgress`). Nothing here changes what a
run computes."""
from __future__ import annotations

import math
import sys

from tqdm.auto import tqdm

from recbench.benchmarks.checkpoint import TrainState
from recbench.datasets.progress import bars_redraw_in_place


class TrainingProgress:
    """The progress display of one run of ``settings`` (a ``TrainSettings``) executed as ``run`` (a ``TrainRun``):
    model ``name``, ``batches_per_epoch`` steps an epoch, with a validation pass or without."""

    def __init__(self, settings, run, name: str, batches_per_epoch: int, validating: bool):
        self.settings, self.run, self.name = settings, run, name
        self.batches_per_epoch, self.validating = batches_per_epoch, validating

    def caps(self) -> tuple[int, int]:
        """(steps, epochs) after which the run ends unless something ends it sooner: the step cap or the epoch
        cap, whichever comes first (a smoke profile keeps the authors' 400,000 steps and ends after 15 epochs)."""
        s = self.settings
        steps = min(s.max_steps or math.inf, s.max_epochs * self.batches_per_epoch)
        return steps, math.ceil(steps / self.batches_per_epoch)

    def early_stopping_can_end(self) -> bool:
        """Whether early stopping can end the run before its caps. The first validation always improves, so it
        takes ``patience`` more, and a stop at the last validation is the cap's: with at most patience + 1
        validations the caps decide (BERT4Rec's smoke profile: patience 20, 15 epochs)."""
        s = self.settings
        if not self.validating or s.patience is None:
            return False
        return math.ceil(self.caps()[1] / s.valid_every) > s.patience + 1

    def end_known(self) -> bool:
        """Whether the caps end the run: no early stopping, pruning callback or budget can end it sooner."""
        s = self.settings
        prunable = self.validating and self.run.on_validation is not None
        return not (self.early_stopping_can_end() or prunable or s.time_budget_s is not None
                    or s.cpu_budget_s is not None)

    def bar(self, state: TrainState) -> tqdm:
        """Counts steps. When the caps end the run, the bar runs to that step and its time left is the run's, at
        the run's average speed so far, validation included (``smoothing=0``: a validation pause then neither
        hides in nor swamps the estimate). When early stopping, a pruner or a budget may end it, nobody knows
        when: the bar shows the steps done, the speed and (:meth:`show`) the epoch against its cap and how close
        early stopping is, and no time left, since a time to the cap would promise hours for a run that early
        stopping ends in minutes. Where bars cannot redraw in place (stderr is a log file) there is no bar but a
        line an epoch (:meth:`show`)."""
        steps, _ = self.caps()
        known = self.end_known()
        drawn = self.run.progress and self.run.bars and bars_redraw_in_place()
        return tqdm(total=steps if known else None, initial=state.step, desc=self.name, unit="step",
                    smoothing=0, disable=not drawn, dynamic_ncols=True, leave=False,
                    bar_format=None if known else "{desc}: {n_fmt} steps [{elapsed}, {rate_fmt}{postfix}]")

    def show(self, bar: tqdm, state: TrainState) -> None:
        """The epoch against its cap, the loss, the best validation value and, with early stopping, how many of
        the validations it waits for have passed without a better value, and the budgets that may end the run;
        a bar ended by the time budget stays on screen and says so. In a log file, the same as a line."""
        s, (_, epochs) = self.settings, self.caps()
        known = self.end_known()
        shown = [f"epoch {state.epoch}/{epochs}" if known else f"epoch {state.epoch} of at most {epochs}",
                 f"loss {state.history[-1]['loss']:.4f}"]
        if self.validating:
            best = f"{state.best_metric:.4f}" if state.best_metric > -math.inf else "–"
            shown.append(f"best {s.valid_metric} {best}")
            if self.early_stopping_can_end():
                shown.append(f"no better for {state.bad_validations}/{s.patience} validations")
        shown += [f"{name} {value:g} s" for name, value in (("time budget", s.time_budget_s),
                                                             ("CPU budget", s.cpu_budget_s)) if value is not None]
        bar.set_postfix_str(", ".join(shown))
        if state.stopped_by == "time budget" and not bar.disable:  # a disabled bar has no description
            bar.set_description_str(f"{bar.desc}: stopped by the {s.time_budget_s:g} s time budget")
            bar.leave = True
        if self.run.progress and bar.disable:
            tqdm.write(self.epoch_line(state, shown, known), file=sys.stderr)

    def epoch_line(self, state: TrainState, shown: list[str], known: bool) -> str:
        """What the bar shows, as one line of a log: the steps (against the run's end when the caps decide it),
        the epoch, the loss, this epoch's validation value and the best, the time trained with the speed, and the
        time left or what ended the run, e.g. ``bert4rec: step 7,254/16,744, epoch 44/104, loss 5.5740, 1:01:21
        trained (1.97 steps/s), 1:20:17 left``."""
        s, (steps, _) = self.settings, self.caps()
        rate = state.step / state.train_seconds if state.train_seconds > 0 else 0.0
        validated = state.history[-1].get(f"valid_{s.valid_metric}")
        parts = [f"step {state.step:,}/{steps:,}" if known else f"step {state.step:,}", *shown[:2],
                 *([f"{s.valid_metric} {validated:.4f}"] if validated is not None else []), *shown[2:],
                 f"{tqdm.format_interval(state.train_seconds)} trained ({rate:.2f} steps/s)"]
        if state.stopped_by == "time budget":
            parts.append(f"stopped by the {s.time_budget_s:g} s time budget")
        elif state.stopped_by is not None:
            parts.append(f"stopped: {state.stopped_by}")
        elif known and rate > 0:
            parts.append(f"{tqdm.format_interval((steps - state.step) / rate)} left")
        return f"{self.run.label or self.name}: " + ", ".join(parts)
