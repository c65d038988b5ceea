"""lavad: an online scheduler daemon for cloud data centers.

The subpackages map the repository's top-level folders: ``lavad.daemon``
(decision core and the processes around it), ``lavad.streams`` (events,
codecs, sources and sinks) and ``lavad.models`` (online models).
"""

__version__ = "0.1.0"
