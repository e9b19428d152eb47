"""The operations of one namespace (one stripe), assembled from their floors."""

from __future__ import annotations

from distsched.ops.recurring import Recurring
from distsched.ops.runtime import Runtime
from distsched.ops.settings import Settings


class Ops(Runtime, Settings, Recurring):
    """Every operation of one namespace, with the scheduler's settings (pure, no I/O).

    Reads (:class:`~distsched.ops.inspect.Inspect`, over the paged listings of
    :class:`~distsched.ops.listing.Listing`) are the floor the others stand on;
    :class:`~distsched.ops.runtime.Runtime` moves tasks, :class:`~distsched.ops.settings.
    Settings` writes the namespace's settings, :class:`~distsched.ops.recurring.Recurring`
    keeps its schedules.
    """
