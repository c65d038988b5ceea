"""Offline evaluations that reproduce papers' experiments on the real traces."""
