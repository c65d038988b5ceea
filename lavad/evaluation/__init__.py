"""Offline studies that reproduce and extend the papers' experiments (``lavad evaluate``).

Kept out of the daemon's packages: the live daemon imports nothing from
here, so its import graph and image hold only what runs live. Plotting
(matplotlib) comes with the ``evaluation`` extra.
"""
