"""A web dashboard for one namespace: ``distsched dashboard``, or :func:`create_app`; for
several namespaces of one Redis with a switcher between them, :func:`create_multi_app`.

Needs the ``dashboard`` extra (``pip install 'distsched[dashboard]'``). Pages are
rendered on the server and refreshed by a little plain JavaScript polling a JSON
endpoint; every page costs a bounded number of Redis commands however many tasks
the namespace holds.
"""

from __future__ import annotations

from distsched.dashboard.app import create_app
from distsched.dashboard.namespaces import create_multi_app

__all__ = ["create_app", "create_multi_app"]
