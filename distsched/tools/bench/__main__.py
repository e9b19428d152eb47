"""``python -m distsched.tools.bench worker URL NAMESPACE ...``: one worker process of
the bench."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from distsched.tools.bench.procs import worker_main


def main(argv: Sequence[str]) -> int:
    if argv and argv[0] == "worker":
        return worker_main(argv[1:])
    print("usage: python -m distsched.tools.bench worker URL NAMESPACE --out FILE", file=sys.stderr)
    return 2


sys.exit(main(sys.argv[1:]))
