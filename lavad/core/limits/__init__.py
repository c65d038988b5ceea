"""Limit decisions from the usage stream: which recommender sets each VM's CPU and memory limits."""
