"""Draining hosts by live migration: defragmentation and maintenance (LARS, LAVA paper 4.4).

Where a migration decision is made, by folder:

* ``triggers.py``: *which* hosts drain and when (empty hosts ran short, or
  a recorded schedule for evaluations; maintenance drains come as events).
* ``orders.py``: *which* queued VM moves next (LARS: the longest predicted
  remaining lifetime first; the baselines).
* ``lifetimes.py``: where the predicted remaining lifetimes come from.
* ``planner.py``: the queue, the concurrency cap and the timers, and the
  published plans.
* ``relief_rule.py`` and ``relief.py``: GPA hosts whose realised overflows
  reject their promise (an exact binomial test), and which of their VMs
  leave (the fewest, largest excess first) for hosts GPA's fit test
  accepts; with ``[migrations.relief.drift]``, also hosts that a VM's
  change of regime (``models/usage/drift.py``) puts past the fit test.
"""
