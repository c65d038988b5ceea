"""Any lifetime model's P(T > e) recalibrated online (``calibration.py``), as a wrapper.

The life tables take a ``calibrator`` themselves (the evaluation's
``"tables-calibrated"``); a model that computes its own rows (the mixture,
the frailty) is wrapped instead: row i of this model is the base model's row i through the
calibrator's current map, brought up to date on its first use after a
refit. What is calibrated, and when it learns, is the calibrator's: each
VM's curve at creation is recorded by its group rows (``record``), exits
and evictions are deferred to the next refit, and every count is resolved
at refits in event time (replay and live agree).
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from lavad.models.arrays import FloatArray, grown
from lavad.models.lifetime.calibration import SurvivalCalibrator
from lavad.models.lifetime.combos import CountsOf
from lavad.models.lifetime.grouped import GroupedLifeTables
from lavad.models.lifetime.protocol import GroupRows, RunningVMs


class CalibratedLifeTables(CountsOf):
    """``base``'s distributions through ``calibrator``: row i is base row i, recalibrated."""

    def __init__(self, base: GroupedLifeTables, calibrator: SurvivalCalibrator) -> None:
        if base.calibrator is not None:
            raise ValueError("the base model is recalibrated already")
        self.base = base
        super().__init__(
            base.bins, base.min_observations, max_rows=base.max_rows, calibrator=calibrator
        )
        # The epoch each row was calibrated in (bumped by every refit and recount).
        self._row_epoch = np.full(len(self.mass), -1, dtype=np.int64)
        self._representative = np.ascontiguousarray(self.bins.representative, dtype=np.float64)
        self._epoch = 0
        self._last_learned: float | None = None

    def counted(self) -> GroupedLifeTables:
        """The base model: the counts are its own."""
        return self.base

    # ------------------------------------------------------------ predicting

    def rows_for(self, keys: tuple[Hashable, ...]) -> GroupRows:
        return self.base.rows_for(keys)

    def choose(self, rows: GroupRows) -> int:
        """The base model's row for these group rows, recalibrated; its raw curve recorded."""
        row = self.base.choose(rows)
        if row >= len(self._row_epoch):
            self._grow_rows(len(self.base.mass))
        calibrator = self.calibrator
        assert calibrator is not None
        if self._row_epoch[row] != self._epoch:
            base_m0 = self.base.m0[row]
            total = base_m0[0]
            raw = self.raw_survival[row]
            np.divide(base_m0[1 : self.bins.count], total if total > 0 else 1.0, out=raw)
            calibrator.fill_row(raw, self._representative, self.mass, self.m0, self.m1, row)
            self.calibrated_at[row] = calibrator.map_version
            self._row_epoch[row] = self._epoch
        calibrator.record(rows, self.raw_survival[row])
        return row

    def _grow_rows(self, size: int) -> None:
        self._grow_tables(size)
        self.raw_survival = grown(self.raw_survival, size)
        self.calibrated_at = grown(self.calibrated_at, size, -1)
        self._row_epoch = grown(self._row_epoch, size, -1)

    # ------------------------------------------------------------ learning

    def observe_exit(self, rows: GroupRows, lifetime: float, now: float = 0.0) -> None:
        self.base.observe_exit(rows, lifetime, now)
        assert self.calibrator is not None
        self.calibrator.defer(rows, lifetime, now, exited=True)

    def observe_censored(self, rows: GroupRows, seen: float, now: float = 0.0) -> None:
        self.base.observe_censored(rows, seen, now)
        assert self.calibrator is not None
        self.calibrator.defer(rows, seen, now, exited=False)

    def observe_running(self, row: int, uptimes: FloatArray, now: float = 0.0) -> None:
        self.base.observe_running(row, uptimes, now)
        self._epoch += 1

    def refit(self, running: RunningVMs, *, now: float = 0.0) -> None:
        """Refit the base, resolve the predictions since the last refit, recalibrate.

        ``running.chosen`` (rows of this model, the base's rows) are brought up to date.
        """
        self.base.refit(running, now=now)
        previous, self._last_learned = self._last_learned, now
        self._learn_calibration(previous, now, running)
        self._epoch += 1
        if running.chosen is not None:
            rows = running.chosen
            if len(rows) and rows[-1] >= len(self._row_epoch):
                self._grow_rows(len(self.base.mass))
            for row in rows.tolist():
                base_m0 = self.base.m0[row]
                total = base_m0[0]
                self.raw_survival[row] = base_m0[1 : self.bins.count] / (
                    total if total > 0 else 1.0
                )
            self._calibrate(rows)
            self._row_epoch[rows] = self._epoch
