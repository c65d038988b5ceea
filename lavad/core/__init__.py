"""The decision core: pure, synchronous and deterministic (time is an argument).

Engine, cluster state, placement, migrations, admission, limits and metrics.
It performs no I/O and imports nothing of the process around it (the live
and replay shells, settings, command line, federation, evaluation);
tests/test_import_contract.py holds that.
"""
