"""Encoding and decoding of what a task carries: its payload (msgpack map of
``fn``, ``args``, ``kwargs``, ``trace``, ``timeout``), its result, and the text of
an error.

Decoding is bounded: a value nested deeper than :data:`READ_DEPTH` is cut and
marked with :data:`CUT_MARK` rather than read, so a hostile payload costs no more
than its size. ``lua/lib/payload.lua`` checks the same payload on the server.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from typing import Any

import msgpack

from distsched import limits
from distsched.errors import InvalidArgument, PayloadTooLarge
from distsched.validate import DEFAULT_MAX_PAYLOAD_BYTES, TIMEOUT_MAX_MS

# The most UTF-8 bytes of error text stored for a failed attempt (fail.lua refuses more).
ERROR_MAX_BYTES = limits.MAX_ERROR_BYTES
# Room kept for the line that says how much of a long traceback was cut.
ERROR_CUT_MARK_BYTES = 80


def encode_payload(
    fn: object,
    args: object,
    kwargs: object,
    max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    trace: Mapping[str, str] | None = None,
    timeout: int | None = None,
) -> bytes:
    """Encode the payload map ``{"fn", "args", "kwargs"}`` with msgpack, ``trace``
    (the producer's W3C trace context headers) when given, and ``timeout`` (the run's
    time limit in ms, from :func:`timeout_ms`) when given."""
    name = _checked_fn(fn)
    args, kwargs = _checked_arguments(args, kwargs)
    # Empty args and kwargs are left out: a queued no-op task then costs less memory.
    payload: dict[str, Any] = {"fn": name}
    if args:
        payload["args"] = list(args)
    if kwargs:
        payload["kwargs"] = dict(kwargs)
    if trace:
        payload["trace"] = dict(trace)
    if timeout is not None:
        payload["timeout"] = timeout
    data = _packed_payload(payload, args)
    _check_room(payload, data, max_bytes)
    return data


def _checked_fn(fn: object) -> str:
    if not isinstance(fn, str) or not fn:
        raise InvalidArgument("fn", "must be a non-empty str naming a registered function")
    try:
        fn.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument("fn", "must be valid UTF-8 (no lone surrogates)") from None
    return fn


def _checked_arguments(
    args: object, kwargs: object
) -> tuple[list[Any] | tuple[Any, ...], Mapping[Any, Any]]:
    if isinstance(args, (str, bytes)) or not isinstance(args, (list, tuple)):
        raise InvalidArgument("args", "must be a list or tuple")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping):
        raise InvalidArgument("kwargs", "must be a mapping")
    if not all(isinstance(k, str) for k in kwargs):
        raise InvalidArgument("kwargs", "keys must be str")
    return args, kwargs


def _packed_payload(payload: dict[str, Any], args: list[Any] | tuple[Any, ...]) -> bytes:
    """The payload in msgpack; what cannot be encoded is refused naming its argument."""
    try:
        data: bytes = msgpack.packb(payload, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        bad = "args"
        try:
            msgpack.packb(list(args), use_bin_type=True)
        except (TypeError, ValueError, OverflowError):
            pass
        else:
            bad = "kwargs"
        raise InvalidArgument(bad, f"cannot be encoded with msgpack: {exc}") from None
    return data


def _check_room(payload: dict[str, Any], data: bytes, max_bytes: int) -> None:
    """Refuse a payload over ``max_bytes`` or the scripts' count of values, naming the
    part that takes the most room."""
    if len(data) > max_bytes:
        sizes = {
            "fn": len(payload["fn"].encode("utf-8")),
            "args": len(msgpack.packb(payload.get("args", []), use_bin_type=True)),
            "kwargs": len(msgpack.packb(payload.get("kwargs", {}), use_bin_type=True)),
        }
        field_name = max(sizes, key=lambda name: sizes[name])
        raise PayloadTooLarge(field_name, f"payload is {len(data)} bytes, limit {max_bytes}")
    # A payload holds at most as many values as it has bytes: only a larger one is counted.
    most = limits.MAX_PAYLOAD_VALUES
    if len(data) > most and payload_values(data) > most:
        args_n, kwargs_n = len(payload.get("args", ())), len(payload.get("kwargs", ()))
        field_name = "args" if args_n >= kwargs_n else "kwargs"
        raise PayloadTooLarge(
            field_name, f"payload has more than {most} msgpack values (MAX_PAYLOAD_VALUES)"
        )


def payload_values(raw: bytes) -> int:
    """The msgpack values of an encoded payload as the scripts count them (the map
    itself, every key and every value inside it, and one more for each character outside
    ASCII in a string): at most ``len(raw)``, which it replies for a value it cannot read."""
    count = 1

    def text(value: Any) -> int:
        if value.__class__ is str and not value.isascii():
            return len(value) - len(value.encode("ascii", "ignore"))
        return 0

    def items(values: list[Any]) -> list[Any]:
        nonlocal count
        count += len(values) + sum(map(text, values))
        return values

    def pairs(entries: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
        nonlocal count
        count += 2 * len(entries) + sum(text(k) + text(v) for k, v in entries)
        return entries

    try:
        msgpack.unpackb(
            raw, raw=False, strict_map_key=False, list_hook=items, object_pairs_hook=pairs
        )
    except (ValueError, msgpack.exceptions.ExtraData, msgpack.exceptions.StackError):
        return len(raw)
    return count


def encode_result(result: object) -> bytes:
    if result is None:
        return b""
    try:
        data: bytes = msgpack.packb(result, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidArgument("result", f"cannot be encoded with msgpack: {exc}") from None
    return data


def error_text(error: object) -> str:
    """The text stored for a failed attempt, at most ``ERROR_MAX_BYTES`` of UTF-8.

    An exception that was raised keeps its traceback (chained causes included),
    ending with its ``Type: message`` line; one never raised is ``Type: message``.
    A traceback too long for the bound loses its outermost frames first, so the
    frame that raised and the type/message line are always kept.
    """
    if isinstance(error, BaseException):
        if error.__traceback__ is None and error.__cause__ is None and error.__context__ is None:
            return _cut_tail(f"{type(error).__name__}: {_safe_str(error)}", ERROR_MAX_BYTES)
        return _bounded_traceback(error)
    if isinstance(error, str):
        return _cut_tail(error, ERROR_MAX_BYTES)
    raise InvalidArgument("error", "must be a str or an exception")


def _safe_str(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:
        # A broken __str__ must not lose the failure it describes.
        return "<exception str() failed>"


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "replace")


def _cut_tail(text: str, limit: int) -> str:
    """``text`` as valid UTF-8, its first ``limit`` bytes at most."""
    raw = _utf8(text)
    return raw[:limit].decode("utf-8", "ignore")


def _bounded_traceback(error: BaseException) -> str:
    parts = traceback.format_exception(type(error), error, error.__traceback__)
    whole = "".join(parts).rstrip("\n")
    if len(_utf8(whole)) <= ERROR_MAX_BYTES:
        return _cut_tail(whole, ERROR_MAX_BYTES)
    last = traceback.format_exception_only(type(error), error)
    if parts[-len(last) :] == last:
        frames = parts[: -len(last)]
    else:
        frames, last = parts, [f"{type(error).__name__}: {_safe_str(error)}"]
    # The type/message line comes first in the budget, a huge message cut to a quarter.
    tail = "".join(last).rstrip("\n")
    if len(_utf8(tail)) > ERROR_MAX_BYTES // 4:
        tail = _cut_tail(tail, ERROR_MAX_BYTES // 4 - ERROR_CUT_MARK_BYTES) + " [message cut]"
    budget = ERROR_MAX_BYTES - len(_utf8(tail)) - ERROR_CUT_MARK_BYTES
    kept: list[bytes] = []
    for part in reversed(frames):
        raw = _utf8(part)
        if len(raw) > budget:
            if not kept:
                # One frame larger than the budget: its end, where the raising line is.
                kept.append(raw[len(raw) - budget :])
            break
        kept.append(raw)
        budget -= len(raw)
    body = b"".join(reversed(kept)).decode("utf-8", "ignore")
    cut = len(frames) - len(kept)
    if cut:
        body = f"[the outermost {cut} of {len(frames)} traceback parts cut]\n" + body
    return body + tail


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


# What stands for an array or map nested too deep to read or show.
CUT_MARK = "…"


def cut_deep(value: Any, depth: int) -> Any:
    """``value`` with every array or map deeper than ``depth`` replaced by ``"…"``;
    ``value`` itself when none is (the walk goes no deeper than ``depth``)."""
    return _rebuilt(value, depth) if _deeper(value, depth) else value


_NESTING = (dict, list, tuple)


def _nested(item: Any) -> list[Any]:
    """The arrays and maps right inside an array or map (map keys included)."""
    if type(item) is dict:
        inside = [k for k in item if type(k) in _NESTING]
        return inside + [v for v in item.values() if type(v) in _NESTING]
    return [v for v in item if type(v) in _NESTING]


def _deeper(value: Any, depth: int) -> bool:
    # A walk with its own stack (the value may nest deeper than Python's recursion
    # limit) that steps only on arrays and maps: exact types, so that an ExtType (a
    # namedtuple) counts as the single value it is.
    if type(value) not in _NESTING:
        return False
    stack = [(value, depth)]
    while stack:
        item, left = stack.pop()
        if left <= 0:
            return True
        stack.extend((child, left - 1) for child in _nested(item))
    return False


def _rebuilt(value: Any, depth: int) -> Any:
    # One frame per level (no comprehensions), and callers keep depth far below the limit.
    if type(value) not in _NESTING:
        return value
    if depth <= 0:
        return CUT_MARK
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            out[_rebuilt(k, depth - 1)] = _rebuilt(v, depth - 1)
        return out
    items = []
    for v in value:
        items.append(_rebuilt(v, depth - 1))
    return tuple(items) if isinstance(value, tuple) else items


# How deep the values a reader decodes (status, explain, the dashboard) may nest: past
# it an array or map reads as "…", so that no reader of a stored value, nor a repr of
# it, meets Python's recursion limit. A Python producer's msgpack packs at most 511.
READ_DEPTH = 256


# Every byte but those that start a msgpack array or map.
_NOT_CONTAINER_BYTES = bytes(b for b in range(256) if not (0x80 <= b <= 0x9F or 0xDC <= b <= 0xDF))


def _may_nest(raw: bytes, depth: int) -> bool:
    """Whether ``raw`` may hold arrays or maps nested more than ``depth`` deep: only if
    ``depth`` bytes of it could start one (a count at C speed, where the walk of
    :func:`cut_deep` would visit every item of a large payload)."""
    return len(raw.translate(None, _NOT_CONTAINER_BYTES)) > depth


def unpack_error(exc: BaseException) -> str:
    """Why msgpack could not decode a value, never empty (msgpack's own messages are
    sometimes empty: nesting past its limit raises a bare ``StackError``)."""
    if isinstance(exc, msgpack.exceptions.StackError):
        return "nested deeper than msgpack decodes (1024 arrays or maps; StackError)"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def decode_payload(raw: bytes | None) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    """Decode a stored payload: ``(fn, args, kwargs)``; see :func:`decode_payload_trace`."""
    fn, args, kwargs, _ = decode_payload_trace(raw)
    return fn, args, kwargs


def decode_payload_trace(
    raw: bytes | None, depth: int | None = None
) -> tuple[str, tuple[Any, ...], dict[str, Any], dict[str, str] | None]:
    """Decode a stored payload; raises ``ValueError`` describing what is wrong.

    The fourth value is the producer's trace context, or None when the payload has
    none (a ``trace`` that is not a map of strings is ignored, as any unknown key is).
    See :func:`decode_payload_full`.
    """
    fn, args, kwargs, trace, _ = decode_payload_full(raw, depth)
    return fn, args, kwargs, trace


def decode_payload_full(
    raw: bytes | None, depth: int | None = None
) -> tuple[str, tuple[Any, ...], dict[str, Any], dict[str, str] | None, float | None]:
    """Decode a stored payload: fn, args, kwargs, trace context and time limit (seconds,
    None when the payload has none); raises ``ValueError`` describing what is wrong.

    A nil ``args`` or ``kwargs`` (how JavaScript encoders send ``undefined``) is empty.
    A payload that is a msgpack string is the claim script's reason why the task
    cannot run (a corrupt record): it is raised as the error.

    With ``depth`` (a reader's decoding), arrays and maps nested deeper than it read
    as ``"…"``, however deep the stored payload goes; without it (a worker's), a
    payload msgpack cannot decode raises.
    """
    data = _unpacked(raw, depth)
    if isinstance(data, str):
        raise ValueError(data)
    if not isinstance(data, dict):
        raise ValueError("payload is not a msgpack map")
    fn, args, kwargs = _call_fields(data)
    limit = _timeout_field(data)
    return fn, tuple(args), kwargs, _trace_field(data), None if limit is None else limit / 1000.0


def _unpacked(raw: bytes | None, depth: int | None) -> Any:
    if not raw:
        raise ValueError("payload is missing")
    try:
        data = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except msgpack.exceptions.StackError as exc:
        if depth is None:
            raise ValueError(f"payload is not msgpack: {unpack_error(exc)}") from None
        try:
            data = msgpack.unpackb(cut_packed(raw, depth), raw=False, strict_map_key=False)
        except Exception as again:
            raise ValueError(f"payload is not msgpack: {unpack_error(again)}") from None
    except Exception as exc:
        raise ValueError(f"payload is not msgpack: {unpack_error(exc)}") from None
    if depth is not None and _may_nest(raw, depth):
        data = cut_deep(data, depth)
    return data


def _call_fields(data: dict[Any, Any]) -> tuple[str, list[Any], dict[str, Any]]:
    fn, args, kwargs = data.get("fn"), data.get("args"), data.get("kwargs")
    args = [] if args is None else args
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(fn, str) or not fn:
        raise ValueError("payload field 'fn' must be a non-empty string")
    if not isinstance(args, list):
        raise ValueError("payload field 'args' must be an array")
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ValueError("payload field 'kwargs' must be a map with string keys")
    return fn, args, kwargs


def _trace_field(data: dict[Any, Any]) -> dict[str, str] | None:
    """The trace context headers; None when absent or not a map of strings."""
    trace = data.get("trace")
    if not isinstance(trace, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in trace.items()
    ):
        return None
    return trace


def _timeout_field(data: dict[Any, Any]) -> int | None:
    limit = data.get("timeout")
    if limit is not None and (
        not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= TIMEOUT_MAX_MS
    ):
        raise ValueError(
            f"payload field 'timeout' must be an integer number of milliseconds in "
            f"[1, {TIMEOUT_MAX_MS}]"
        )
    return limit


# msgpack heads: first byte -> (bytes of the head, bytes of its length field); a
# fixed-size value's head is the whole value.
_FIXED_SIZES = {
    0xC0: 1, 0xC2: 1, 0xC3: 1, 0xCA: 5, 0xCB: 9, 0xCC: 2, 0xCD: 3, 0xCE: 5, 0xCF: 9,
    0xD0: 2, 0xD1: 3, 0xD2: 5, 0xD3: 9, 0xD4: 3, 0xD5: 4, 0xD6: 6, 0xD7: 10, 0xD8: 18,
}  # fmt: skip
# Sized values: first byte -> (bytes of the length field, extra head bytes after it).
_SIZED = {0xC4: (1, 0), 0xC5: (2, 0), 0xC6: (4, 0), 0xC7: (1, 1), 0xC8: (2, 1), 0xC9: (4, 1),
          0xD9: (1, 0), 0xDA: (2, 0), 0xDB: (4, 0)}  # fmt: skip
# Arrays and maps: first byte -> (bytes of the count field, items per count).
_CONTAINERS = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}
_CUT_PACKED = msgpack.packb(CUT_MARK)


def _head(raw: bytes, pos: int) -> tuple[int, int]:
    """(bytes of the value's head, items inside it: -1 for a value that is no array
    or map, whose head is then the whole value) of the value at ``pos``."""
    if pos >= len(raw):
        raise ValueError("payload ends inside a value")
    b = raw[pos]
    if b <= 0x7F or b >= 0xE0:
        return 1, -1
    if 0x80 <= b <= 0x8F:
        return 1, 2 * (b & 0x0F)
    if 0x90 <= b <= 0x9F:
        return 1, b & 0x0F
    if 0xA0 <= b <= 0xBF:
        return 1 + (b & 0x1F), -1
    if b in _FIXED_SIZES:
        return _FIXED_SIZES[b], -1
    if b in _SIZED:
        width, extra = _SIZED[b]
        return 1 + width + extra + int.from_bytes(raw[pos + 1 : pos + 1 + width], "big"), -1
    if b in _CONTAINERS:
        width, per = _CONTAINERS[b]
        return 1 + width, per * int.from_bytes(raw[pos + 1 : pos + 1 + width], "big")
    raise ValueError(f"byte 0x{b:02x} starts no msgpack value")


def cut_packed(raw: bytes, depth: int) -> bytes:
    """The msgpack value ``raw`` with every array or map nested deeper than ``depth``
    (the outermost is 1) packed as the string ``"…"``: a value too deep for msgpack to
    decode, cut so that it decodes. Walks with its own stack, one step per item."""
    out = bytearray()
    pos = 0
    open_items = [1]  # items still to read in each open array or map, outermost first
    while open_items:
        if open_items[-1] == 0:
            open_items.pop()
            continue
        open_items[-1] -= 1
        size, items = _head(raw, pos)
        if items < 0 or len(open_items) <= depth:
            out += raw[pos : pos + size]
            pos += size
            if items >= 0:
                open_items.append(items)
            continue
        skip = 1  # values left to skip: this array or map, then all it holds
        while skip:
            size, items = _head(raw, pos)
            pos += size
            skip += max(items, 0) - 1
        out += _CUT_PACKED
    if pos > len(raw):
        raise ValueError("payload ends inside a value")
    return bytes(out)


def decode_value(raw: bytes, depth: int = READ_DEPTH) -> Any:
    """A stored msgpack value as a reader sees it: arrays and maps nested deeper than
    ``depth`` read as ``"…"``, however deep the stored value goes."""
    try:
        value = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except msgpack.exceptions.StackError:
        value = msgpack.unpackb(cut_packed(raw, depth), raw=False, strict_map_key=False)
    return cut_deep(value, depth) if _may_nest(raw, depth) else value


def _bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode("utf-8")
