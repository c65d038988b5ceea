"""``python -m benchmarks.placement_matrix``: ``lavad evaluate placement`` on
``../shared/data`` with the repository's configuration (``config/lavad.toml``),
as the results pages quote it.

The options are the command's (``lavad evaluate placement --help``), and
``--data DIR`` reads another folder laid out as ``../shared/data`` (the
command's argument): held-back traces of the same kinds. The protocol is
``lavad.evaluation.placement_matrix``'s.
"""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.lifetime_ablation import CONFIG
from lavad.daemon.cli import main as lavad

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    data = SHARED
    for i, arg in enumerate(args):
        if arg == "--data" and i + 1 < len(args):
            data = Path(args[i + 1])
            del args[i : i + 2]
            break
        if arg.startswith("--data="):
            data = Path(arg.removeprefix("--data="))
            del args[i]
            break
    if "--config" not in args and not any(arg.startswith("--config=") for arg in args):
        args = ["--config", str(CONFIG), *args]
    lavad(["evaluate", "placement", str(data), *args])


if __name__ == "__main__":
    main()
