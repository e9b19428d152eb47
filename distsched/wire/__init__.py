"""The wire floor: everything that knows how distsched talks to Redis.

- :mod:`~distsched.wire.calls` builds the script calls (and splits long batches
  within the scripts' caps);
- :mod:`~distsched.wire.payload` encodes and decodes payloads, results and errors;
- :mod:`~distsched.wire.records` is the one place that knows each stored byte
  layout (the Lua scripts write the same layouts);
- :mod:`~distsched.wire.replies` decodes script replies and turns script errors
  into exceptions.

Nothing here does I/O: the operations (:mod:`distsched.ops`) send what is built here
and hand the replies back.
"""
