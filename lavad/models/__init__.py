"""Online models learned from the streams: lifetimes, usage, deployment scaling."""
