"""Stripes placed on purpose: salts that put a namespace's stripes on distinct masters.

Redis Cluster hashes a stripe's tag (``ns{s``) to a slot, and nothing makes the k
stripes of a namespace land on k different masters: with three masters, three plain
stripes share a master more often than not. A namespace created with stripes on a
cluster therefore picks, for each stripe s > 0, the smallest salt whose tag
``ns{s.SALT`` hashes to a slot of a master no other stripe uses (stripe 0 keeps
``{ns}``, which every client finds without reading anything); with more stripes than
masters, each goes to the master with the fewest stripes so far. The salts are stored
with the stripe count in stripe 0's ``meta`` (field ``stripe_salts``,
``"0,SALT1,SALT2,..."``) and read with it by every client.

Placement holds for the slot map it was chosen on: a reshard that moves a stripe's slot
may put two stripes on one master again (``distsched stripes`` shows it), and the
slots can be moved back with ``redis-cli --cluster reshard`` (it names them).
"""

from __future__ import annotations

import binascii
from collections.abc import Callable, Sequence

from distsched.keys import MAX_SALT, Keys

SALTS_FIELD = "stripe_salts"
SLOTS = 16384


def slot_of(tag: str) -> int:
    """The cluster slot of keys with hash tag ``tag`` (CRC16 XMODEM modulo 16384)."""
    return binascii.crc_hqx(tag.encode("utf-8"), 0) % SLOTS


def choose_salts(
    namespace: str, stripes: int, owner: Callable[[int], str | None]
) -> tuple[int, ...]:
    """A salt per stripe (stripe 0's is 0) such that the stripes' slots belong to
    distinct masters by ``owner(slot)`` (a master's name; None: nobody known), as far
    as there are masters; beyond that, spread evenly."""
    used: dict[str, int] = {}
    first = owner(slot_of(namespace))
    if first is not None:
        used[first] = 1
    salts = [0]
    for stripe in range(1, stripes):
        best: tuple[int, int] | None = None  # (stripes already on its master, salt)
        for salt in range(MAX_SALT + 1):
            tag = Keys(namespace, stripe, (*salts, salt)).tag
            master = owner(slot_of(tag))
            if master is None:
                continue
            load = used.get(master, 0)
            if best is None or load < best[0]:
                best = (load, salt)
            if load == 0 or salt >= 512:
                break  # a free master, or long enough looking for one
        salt = 0 if best is None else best[1]
        salts.append(salt)
        master = owner(slot_of(Keys(namespace, stripe, tuple(salts)).tag))
        if master is not None:
            used[master] = used.get(master, 0) + 1
    return tuple(salts)


def encode_salts(salts: Sequence[int]) -> str:
    return ",".join(str(s) for s in salts)


def decode_salts(raw: object, stripes: int) -> tuple[int, ...]:
    """The salts stored for ``stripes`` stripes; () (plain tags) when absent, or when
    what is stored is not one salt per stripe (written by other means)."""
    if raw is None:
        return ()
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    try:
        salts = tuple(int(part) for part in text.split(","))
    except ValueError:
        return ()
    if len(salts) != stripes or any(not 0 <= s <= MAX_SALT for s in salts) or salts[0]:
        return ()
    return salts


def masters_spanned(keys: Sequence[Keys], owner: Callable[[int], str | None]) -> list[str | None]:
    """The master of each stripe's slot, stripe 0 first (None: not known)."""
    return [owner(slot_of(k.tag)) for k in keys]
