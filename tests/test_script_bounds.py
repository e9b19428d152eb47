"""Every script bounds its own work, whatever the caller sends (README "Security").

Each cap of ``distsched/limits.py`` (mirrored in ``lua/lib/limits.lua``) is checked from a
raw ``EVALSHA``, as a producer in another language would send it: a call just over the cap
is refused with ``BADARG`` naming the cap and writes nothing, and a call at the cap is
accepted. No timing here: ``distsched bench`` measures the calls at the caps.
"""

from __future__ import annotations

import re

from distsched import core, limits, scripts

LIMIT_NAMES = [name for name in dir(limits) if name.isupper()]


def lua_limits() -> dict[str, int]:
    text = (scripts.lua_dir() / "lib" / "limits.lua").read_text("utf-8")
    return {m[0]: int(m[1]) for m in re.findall(r"^local (\w+) = (\d+)$", text, re.M)}


def test_the_lua_caps_are_the_python_caps_name_for_name() -> None:
    assert lua_limits() == {name: getattr(limits, name) for name in LIMIT_NAMES}
    assert len(LIMIT_NAMES) == 14


def test_each_cap_is_written_once_per_language() -> None:
    # The client's own constants are the caps themselves, not copies of their numbers.
    assert core.MAX_DEPS is limits.MAX_DEPS_PER_TASK
    assert core.DEFAULT_MAX_PAYLOAD_BYTES is limits.DEFAULT_MAX_PAYLOAD_BYTES
    assert core.ERROR_MAX_BYTES is limits.MAX_ERROR_BYTES
    assert core.REPORTS_PER_CALL is limits.MAX_REPORTS_PER_CALL
    for part in ("lib/payload.lua", "add_deps.lua", "schedule.lua"):
        text = (scripts.lua_dir() / part).read_text("utf-8")
        assert not re.search(r"^local (MAX_DEPS|DEFAULT_MAX_PAYLOAD|MAX_ADDED)\b", text, re.M)
