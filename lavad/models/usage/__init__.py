"""Online models of VM usage, for stochastic bin packing.

- ``moments.py``: per VM, the online mean and variance of its CPU and memory
  usage (weighted Welford, optionally decayed by a half-life in event time).
- ``hosts.py``: per host column, the sums of its VMs' usage means and
  variances in absolute units, updated in O(1) on place, exit and new sample.
"""
