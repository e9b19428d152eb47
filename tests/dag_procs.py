"""A program the dependency race tests run as separate processes.

``python tests/dag_procs.py complete URL NAMESPACE``
    Reads one JSON line of claim tokens ``[[task_id, version, attempt], ...]`` from
    stdin, prints ``ready``, waits for a second line (so that every process starts at
    once), then reports each token with its own ``complete`` call, in the order given.
    Prints the outcomes as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys

from distsched import Claim, Scheduler


def token_claim(task_id: str, version: int, attempt: int) -> Claim:
    """A claim rebuilt from its token: reports are fenced by the token alone."""
    return Claim(
        task_id=task_id,
        version=version,
        attempt=attempt,
        fn="f",
        args=(),
        kwargs={},
        priority=0,
        run_at=0.0,
    )


def complete_main(url: str, namespace: str) -> int:
    tokens = json.loads(sys.stdin.readline())
    claims = [token_claim(str(t), int(v), int(a)) for t, v, a in tokens]
    s = Scheduler.from_url(url, namespace=namespace, lease_s=60.0)
    outcomes: list[str] = []
    try:
        # Connect before the start line, so the first report is not slowed by it.
        s.server_time()
        print("ready", flush=True)
        sys.stdin.readline()
        for claim in claims:
            outcomes.append(s.complete(claim).value)
    finally:
        s.close()
    print(json.dumps(outcomes), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["complete"])
    parser.add_argument("url")
    parser.add_argument("namespace")
    args = parser.parse_args(argv)
    return complete_main(args.url, args.namespace)


if __name__ == "__main__":
    sys.exit(main())
