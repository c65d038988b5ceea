"""GPA that reacts: the time-aligned future played out with the live relief rule.

``gpa-online rho`` packs the future once and never moves a VM. A live pool
can: ``core/migrations/relief.py`` relieves a host whose realised
overflows reject its promise. ``gpa-react rho`` packs like gpa-online, then
steps through the future in time order, one 300 s step a window:

1. each machine whose tasks all have a reading is one scored window:
   counted in q (every overflow, those before a reaction included), fed to
   the pool's ``TailCalibration`` against the machine's promise (its
   cumulant sums at its last change), and recorded in the relief rule's
   ``OverflowEvidence``;
2. every task's moments take in the step's reading (mean, variance, third
   and fourth cumulants over the history and the future seen so far: the
   live moments without decay, the GPA policy's default);
3. each machine the rule finds due is relieved by ``plan_relief`` with the
   calibration's current method and margin and the current moments, unless
   a relief of it is still migrating. A live migration takes
   ``migrations.duration_s`` (1,200 s: ``migration_steps`` = 4): the daemon
   books a moved VM on its target at once, so its usage counts there for the
   margin and the rule (the live view), while the VM runs on its source
   until the migration is done, so q (what happens) counts it there until
   then, and both machines are in use.

Same functions as live (``OverflowEvidence.record`` and ``due``,
``plan_relief``), so the evaluation measures the rule the daemon would run.
m is the time-averaged machines in use over the future against the same
lower bound as every method; migrations are per VM-day of the future.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lavad.core.cluster import FloatArray
from lavad.core.migrations.relief import (
    OverflowEvidence,
    ReliefConfig,
    TailFit,
    new_host_indices,
    plan_relief,
)
from lavad.core.placement.gpa import quantile_factor
from lavad.evaluation.stochastic_packing import RELATIVE_TOLERANCE, Packing
from lavad.models.usage.drift import CusumDrift, DriftConfig
from lavad.models.usage.margin import HostWindow, TailCalibration
from lavad.models.usage.tail import tail_factor

STEPS_PER_DAY = 288


class RunningCumulants:
    """Per task, power sums of its readings so far: the current moments in O(1) per reading."""

    def __init__(self, history: FloatArray) -> None:
        seen = np.isfinite(history)
        values = np.where(seen, history, 0.0)
        self.count: FloatArray = seen.sum(axis=1).astype(np.float64)
        self.sums: FloatArray = np.stack([(values**power).sum(axis=1) for power in (1, 2, 3, 4)])

    def add(self, column: FloatArray) -> None:
        seen = np.isfinite(column)
        values = np.where(seen, column, 0.0)
        self.count += seen
        for power in range(4):
            self.sums[power] += values ** (power + 1)

    def restart(self, task: int, recent: FloatArray) -> None:
        """Forget the task's readings but ``recent`` (its regime changed)."""
        seen = recent[np.isfinite(recent)]
        self.count[task] = len(seen)
        for power in range(4):
            self.sums[power, task] = float((seen ** (power + 1)).sum())

    def mean_sigma(self) -> tuple[FloatArray, FloatArray]:
        """Each task's mean and standard deviation (ddof=1) so far."""
        terms = self.terms()
        return terms[0], np.sqrt(terms[1])

    def terms(self) -> FloatArray:
        """(4, tasks): mean, variance (ddof=1), third, fourth cumulant (``task_cumulants``)."""
        n = np.maximum(self.count, 1.0)
        raw1, raw2, raw3, raw4 = (self.sums[p] / n for p in range(4))
        mean = raw1
        second = np.maximum(raw2 - mean * mean, 0.0)
        third = raw3 - 3.0 * mean * raw2 + 2.0 * mean**3
        fourth_central = raw4 - 4.0 * mean * raw3 + 6.0 * mean * mean * raw2 - 3.0 * mean**4
        variance = second * n / np.maximum(n - 1.0, 1.0)
        fourth = np.maximum(fourth_central, 0.0) - 3.0 * second * second
        terms: FloatArray = np.vstack([mean, variance, third, fourth])
        return terms


@dataclass(frozen=True, slots=True)
class ReactOutcome:
    q: float
    machines_mean: float
    machines_max: int
    migrations: int
    reliefs: int
    opened: int
    vm_days: float
    # The first step a relief moved something (None: none did).
    first_relief_step: int | None
    # Tasks whose regime change the drift detector caught, and reliefs it started.
    drift_resets: int = 0
    drift_reliefs: int = 0
    # Why a relief stays quiet: overflowed machine-steps of a machine running
    # one task (no move of it helps), and steps a host was due but alone.
    overflows_alone: int = 0
    # Reliefs of a machine relieved less than a day before (the last one did
    # not stop its overflows), and moves of a task whose last hour ran below
    # the mean its moments gave it (the relief read it by a regime it left).
    repeat_reliefs: int = 0
    stale_moves: int = 0
    overflows: int = 0
    scored: int = 0
    due_alone: int = 0

    @property
    def migrations_per_vm_day(self) -> float:
        return self.migrations / self.vm_days if self.vm_days else 0.0


def _promise(
    terms: FloatArray, rho: float, methods: tuple[str, ...]
) -> tuple[float, tuple[float, ...]]:
    """A machine's promise: its mean sum and each method's predicted excess (as live)."""
    z = quantile_factor(rho)
    mean, variance, third, fourth = (float(v) for v in terms)
    variance = max(variance, 0.0)
    sigma = float(np.sqrt(variance))
    excess = tuple(
        float(tail_factor(method, z, rho, variance, third, fourth)) * sigma for method in methods
    )
    return mean, excess


def react(
    history: FloatArray,
    future: FloatArray,
    packing: Packing,
    calibration: TailCalibration,
    capacity: float,
    config: ReliefConfig,
    migration_steps: int = 4,
    drift: DriftConfig | None = None,
) -> ReactOutcome:
    """Play the future out on ``packing``, relieving machines by the live rule (in place on
    ``calibration``, which keeps learning).

    With ``drift`` enabled, each task's reading is first tested by the
    CUSUM of ``models/usage/drift.py`` against its moments so far; a task
    whose usage left its history restarts its moments from its last
    ``drift.reseed`` readings, and its machine, read again with them through
    the pool's fit test, is relieved at once when it no longer passes,
    without waiting for the binomial rule.
    """
    n_tasks, n_steps = future.shape
    if history.shape[0] != n_tasks:
        raise ValueError("history and future must have the same tasks")
    if migration_steps < 0:
        raise ValueError(f"migration_steps must be >= 0, got {migration_steps}")
    rho = calibration.rho
    methods = calibration.settings.methods
    # Where each task is booked (the live view) and where it runs (q).
    owner = packing.bin_of(n_tasks)
    if (owner < 0).any():
        raise ValueError("every task must be packed")
    running = owner.copy()
    # (first step on the target, task, target), in decision order.
    in_flight: list[tuple[int, int, int]] = []
    # Source machine -> the step its last relief's migrations are done.
    migrating: dict[int, int] = {}
    bins = [sorted(tasks) for tasks in packing.bins]
    moments = RunningCumulants(history)
    detector = CusumDrift(drift, n_tasks) if drift is not None and drift.enabled else None
    # Readings since each task's last restart (the detector's warm-up).
    since_reset = np.isfinite(history).sum(axis=1).astype(np.int64)
    all_steps = np.hstack([history, future])
    offset = history.shape[1]
    drift_resets = drift_reliefs = repeat_reliefs = stale_moves = 0
    last_relief: dict[int, int] = {}
    current = moments.terms()
    promises = [_promise(current[:, tasks].sum(axis=1), rho, methods) for tasks in bins]
    evidence = OverflowEvidence(rho, config, len(bins))
    counted = overflowed = migrations = reliefs = opened = overflows_alone = due_alone = 0
    machines_total = 0.0
    machines_max = 0
    first_relief: int | None = None
    for step in range(n_steps):
        while in_flight and in_flight[0][0] <= step:
            _, task, target = in_flight.pop(0)
            running[task] = target
        column = future[:, step]
        width = len(bins)
        readings = np.isfinite(column)
        values = np.where(readings, column, 0.0)
        absent = (~readings).astype(np.float64)
        # What happens: each machine's realised sum with the tasks running on it.
        real = np.bincount(running, weights=values, minlength=width)
        real_missing = np.bincount(running, weights=absent, minlength=width)
        real_in_use = np.bincount(running, minlength=width) > 0
        real_scored = np.flatnonzero(real_in_use & (real_missing == 0))
        counted += len(real_scored)
        real_over = real_scored[real[real_scored] > capacity]
        overflowed += len(real_over)
        overflows_alone += int(
            np.count_nonzero(np.bincount(running, minlength=width)[real_over] == 1)
        )
        # What the daemon sees: usage by booked machine.
        sums = np.bincount(owner, weights=values, minlength=width)
        missing = np.bincount(owner, weights=absent, minlength=width)
        in_use = np.bincount(owner, minlength=width) > 0
        machines = int(np.count_nonzero(in_use | real_in_use))
        machines_total += machines
        machines_max = max(machines_max, machines)
        scored = np.flatnonzero(in_use & (missing == 0))
        over = sums[scored] > capacity
        calibration.observe(
            [
                HostWindow(float(sums[h]), promises[h][0], promises[h][1], capacity)
                for h in scored.tolist()
            ]
        )
        drifted: list[int] = []
        if detector is not None:
            mean, sigma = moments.mean_sigma()
            tested = np.flatnonzero(readings)
            reset = detector.update(
                tested, column[tested], mean[tested], sigma[tested], since_reset[tested]
            )
            drifted = tested[reset].tolist()
        moments.add(column)
        since_reset += readings
        reseed = drift.reseed if drift is not None else 0
        for task in drifted:
            end = offset + step + 1
            moments.restart(task, all_steps[task, max(0, end - reseed) : end])
            since_reset[task] = min(reseed, end)
        drift_resets += len(drifted)
        due = evidence.record(scored.astype(np.int64), over)
        fit = TailFit(rho, calibration.method, calibration.margin, capacity * RELATIVE_TOLERANCE)
        broken: set[int] = set()
        if drifted:
            current = moments.terms()
            for host in sorted({int(owner[task]) for task in drifted}):
                tasks = bins[host]
                # As live (``UsageHooks``): the machine promises by its new
                # moments from the next step on, so the margin scores the change
                # in the steps before the detector saw it, not in every step after.
                summed = current[:, tasks].sum(axis=1, keepdims=True)
                promises[host] = _promise(summed[:, 0], rho, methods)
                if len(tasks) > 1 and not bool(fit.fits(summed, capacity)[0]):
                    broken.add(host)
        if not len(due) and not broken:
            continue
        current = moments.terms()
        for host in sorted(set(due.tolist()) | broken):
            # A host that took VMs earlier in this step has lost its evidence.
            if host not in broken and not evidence.due(host):
                continue
            if len(bins[host]) < 2:
                due_alone += 1
                continue
            if migrating.get(host, -1) > step + 1:
                continue  # its last relief is still migrating, as a live drain is
            width = len(bins)
            host_terms = np.zeros((4, width))
            for column_index in range(4):
                host_terms[column_index] = np.bincount(
                    owner, weights=current[column_index], minlength=width
                )
            residents = bins[host]
            moves = plan_relief(
                current[:, residents],
                capacity,
                host_terms,
                np.full(width, capacity),
                fit,
                config.max_moves,
                source=host,
            )
            if not moves:
                continue
            reliefs += 1
            drift_reliefs += host in broken
            repeat_reliefs += step - last_relief.get(host, -STEPS_PER_DAY) < STEPS_PER_DAY
            last_relief[host] = step
            end = offset + step + 1
            for move in moves:
                task = residents[move.vm]
                recent = all_steps[task, max(0, end - 12) : end]
                stale_moves += bool(np.nanmean(recent) < current[0, task])
            if first_relief is None:
                first_relief = step
            landed = new_host_indices(moves, width)
            movers = [residents[move.vm] for move in moves]
            for task, target in zip(movers, landed, strict=True):
                while target >= len(bins):
                    bins.append([])
                    promises.append((0.0, tuple(0.0 for _ in methods)))
                    opened += 1
                bins[host].remove(task)
                bins[target].append(task)
                bins[target].sort()
                owner[task] = target
                in_flight.append((step + 1 + migration_steps, task, target))
            migrating[host] = step + 1 + migration_steps
            migrations += len(moves)
            for changed in {host, *landed}:
                evidence.clear(changed)
                promises[changed] = _promise(current[:, bins[changed]].sum(axis=1), rho, methods)
    return ReactOutcome(
        q=overflowed / counted if counted else 0.0,
        machines_mean=machines_total / n_steps if n_steps else 0.0,
        machines_max=machines_max,
        migrations=migrations,
        reliefs=reliefs,
        opened=opened,
        vm_days=n_tasks * n_steps / STEPS_PER_DAY,
        first_relief_step=first_relief,
        drift_resets=drift_resets,
        repeat_reliefs=repeat_reliefs,
        stale_moves=stale_moves,
        drift_reliefs=drift_reliefs,
        overflows_alone=overflows_alone,
        overflows=overflowed,
        scored=counted,
        due_alone=due_alone,
    )
