"""Online models of VM usage, for stochastic bin packing.

- ``moments.py``: per VM, the online mean and variance of its CPU and memory
  usage (weighted Welford, optionally decayed by a half-life in event time).
- ``hosts.py``: per host column, the sums of its VMs' usage means and
  variances in absolute units, updated in O(1) on place, exit and new sample.
- ``tail.py`` and ``margin.py``: the percentile methods of a host's sum and
  the margin a pool learns on them from realised usage.
- ``drift.py``: per VM, a two-sided CUSUM that says when its usage has left
  its history, so that its moments restart from the new regime.
"""
