"""Placement: filters narrow the hosts, scores rank them, a seeded draw breaks ties.

A policy is a named combination of filter and score plugins built by the
registry (``registry.py``) from validated configuration; baselines and the
paper algorithms are policies of the same kind, so any two compare on a trace.
"""
