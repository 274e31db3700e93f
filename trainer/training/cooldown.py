"""The learning rate's cooldown: a linear decay to zero over the last part of a run, whose
end is `train_steps` updates or the wall-time budget, whichever comes first.

A run stopped by its budget ends wherever the schedule is when time runs out; the paper's
inverse square root is still at a tenth of its peak or more then. Li et al. (2020),
"Budgeted Training: Rethinking Deep Neural Network Training Under Resource Constraints",
find that decaying the rate linearly to zero as the budget runs out is what a run of a
given budget should do. The trainer multiplies the schedule's rate by `cooldown_factor`.
"""

from typing import Optional


def run_progress(step: int, train_steps: int, elapsed: float = 0.0,
                 budget: Optional[float] = None) -> float:
    """How far a run is, in [0, 1]: the larger of step / train_steps and, with a budget,
    elapsed / budget (seconds of this invocation), so whichever ends the run counts.

    >>> run_progress(250, 1000, elapsed=1800, budget=3600)
    0.5
    """
    done = step / train_steps
    if budget:
        done = max(done, elapsed / budget)
    return min(1.0, done)


def cooldown_factor(fraction: float, step: int, train_steps: int, elapsed: float = 0.0,
                    budget: Optional[float] = None) -> float:
    """The multiplier of the schedule's learning rate for the update after `step`.

    1 until the last `fraction` of the run, then linear down to 0 at its end. The run's
    progress is `run_progress`'s, so whichever of the steps and the budget ends the run
    ends the decay.

    Args:
      fraction: the cooldown's share of the run, in [0, 1]; 0 keeps the schedule as it is.
      step: updates done (the global step: a resumed run counts from its checkpoint).
      train_steps: the run's total updates.
      elapsed, budget: seconds since this invocation's training began, and its wall-time
        budget (None: no budget).

    Example:

    >>> cooldown_factor(0.25, step=875, train_steps=1000)  # half-way through the last 25%
    0.5
    >>> cooldown_factor(0.25, step=100, train_steps=1000, elapsed=3750, budget=4000)
    0.25
    """
    if fraction <= 0.0:
        return 1.0
    done = run_progress(step, train_steps, elapsed, budget)
    return min(1.0, max(0.0, (1.0 - done) / fraction))
