"""Bin-packing quality metrics: time-weighted pool metrics and stranding by inflation."""
