"""The ``lavad`` console script: the federation's processes start without the daemon's CLI.

``lavad federation ...`` runs a pool owner or a global scheduler. The daemon's
command line imports every policy registry, the engine and scipy when it is
imported, none of which a federation process uses, and a process taking over
from a crashed one should be up as soon as it can: so those arguments go to the
federation's command line directly. Everything else, ``lavad federation`` after
a global option included, goes to ``lavad.daemon.cli.main``, which also lists
the federation among its commands.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> None:
    """The console script: ``argv`` without the program name (default: sys.argv's)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["federation"]:
        from lavad.federation.cli import federation_app  # noqa: PLC0415 - the point

        federation_app(args=args[1:], prog_name="lavad federation")
        return
    from lavad.daemon.cli import main as daemon_main  # noqa: PLC0415 - the point

    daemon_main(args)
