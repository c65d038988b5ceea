"""Online models of VM lifetimes as distributions.

- ``protocol.py``: ``LifetimeModel``, what every model gives its users (learn from
  exits and censorings, predict a distribution, checkpoint as plain data), and
  what a caller may skip, declared by the model.
- ``bins.py``: log-spaced lifetime bins, the support of every distribution.
- ``survival.py``: the life-table (binned Kaplan-Meier) estimator and the
  repredictions it gives: E[T_r | T_u] and P(T > t | T_u), vectorised.
- ``grouped.py``: the online, censoring-aware model: life tables per feature
  group at several levels of detail, backing off to coarser groups.
- ``features.py``: the grouping keys a VM request yields (nothing from the future).
- ``shrunk.py``: the same groups, every level's hazards shrunk towards the coarser one.
- ``calibration.py``: an opt-in online recalibration of P(T > e), learned from
  the outcomes of the predictions made at creation.
- ``mixture.py``: life tables at several forgetting rates, mixed online by each
  one's recent log score on the VMs' outcomes (opt in: ``model = "mixture"``).
- ``frailty.py``: an owner's shared frailty: its VMs predicted with S^theta,
  theta the gamma posterior of its deaths against the hazard predicted for them.
- ``calibrated.py``: any model wrapped in the online recalibration of
  ``calibration.py`` (``model = "mixture-frailty-calibrated"`` and friends).
- ``combos.py`` and ``pending.py``: what the mixture and the frailty share: rows
  per (group row, owner) computed on first use after a refit, uptime bands, and
  the VMs resolved between refits that both count.
"""
