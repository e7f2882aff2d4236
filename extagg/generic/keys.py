"""Key identity that survives a spill: what the generic engine does to keys before folding.

The in-memory map groups keys as a ``dict`` does (identity, then ``==``); a spilled key comes
back as an unpickled copy and meets the others by :func:`extagg.hashing.order_hash` and ``==``.
For both to group the same way:

* float NaN (``float`` and subclasses such as ``numpy.float64``), also inside tuples at any
  depth, is replaced by one canonical NaN object, so all NaN keys are one group (in memory by
  identity, in the merge by :func:`extagg.merge.objects.same_key`). ``-0.0`` and ``0.0`` are
  already one group (equal, with equal hashes) as Python says;
* ``str``/``int``/``tuple``/... subclasses that define their own ``__eq__``/``__hash__`` keep
  their Python semantics across spills (``order_hash`` uses their ``__hash__``);
* a key type whose equality cannot survive a copy is rejected when first inserted with a
  :class:`~extagg.errors.BadKeyError`: a class comparing by identity (no ``__eq__``), or one
  whose pickled copy of the first key seen is not equal to it or hashes differently. The check
  runs once per type (cached), on the first key of that type.
"""

from __future__ import annotations

import math
import pickle
import weakref
from collections.abc import Sequence
from itertools import chain
from typing import Any

from extagg.errors import BadKeyError
from extagg.spill.codecs import pickle_by_value

__all__ = ["NAN", "canonical_keys"]

#: the one NaN every NaN key becomes
NAN = float("nan")

_PLAIN = frozenset({int, bool, str, bytes, type(None)})
_PLAIN_OR_FLOAT = _PLAIN | {float}

_OBJECT_EQ: Any = object.__eq__

#: ``type -> None`` (fine as it is) or the reason its keys are rejected
_verdicts: weakref.WeakKeyDictionary[type, str | None] = weakref.WeakKeyDictionary()


def _is_nan(x: Any) -> bool:
    return isinstance(x, float) and math.isnan(x)


def _verdict(key: Any) -> str | None:
    kind = type(key)
    try:
        return _verdicts[kind]
    except KeyError:
        pass
    except TypeError:  # not weak-referenceable: check every time
        return _check_type(key)
    verdict = _check_type(key)
    _verdicts[kind] = verdict
    return verdict


def _check_type(key: Any) -> str | None:
    kind = type(key)
    try:
        hash(key)
    except Exception:
        return None  # the fold reports it, naming the record and the cause
    if kind.__eq__ is _OBJECT_EQ and not _comes_back_itself(key):
        return (
            f"keys of type {kind.__qualname__} compare by identity (no __eq__), so a copy "
            "spilled to disk would be a different key: give the class __eq__ and __hash__"
        )
    try:
        copy = _spilled_copy(key)
        same = bool(copy == key) and hash(copy) == hash(key)
    except Exception:
        # unhashable, or __eq__ raises: the fold reports it with its cause; unpicklable: a
        # spill reports it (SpillError) if one happens
        return None
    if not same:
        return (
            f"a pickled copy of a {kind.__qualname__} key is not equal to it (or hashes "
            "differently), so the key would split into several groups once spilled"
        )
    return None


def _comes_back_itself(key: Any) -> bool:
    """Whether unpickling ``key`` gives ``key`` itself: members of an ``Enum`` and other
    singletons pickled by name compare by identity and still stay one key once spilled."""
    try:
        return _spilled_copy(key) is key
    except Exception:
        return False


def _spilled_copy(key: Any) -> Any:
    """``key`` as a spill gives it back: pickled, or in a PySpark task by PySpark's
    cloudpickle where ``pickle`` cannot name its class (an ``Enum`` of the driver's
    ``__main__`` exists by value there: its members were refused as identity keys)."""
    try:
        data = pickle.dumps(key, pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        failure = exc
        data = pickle_by_value(key, failure, lambda: failure)
    return pickle.loads(data)


def _canonical(key: Any, index: int) -> Any:
    """``key`` with NaN made canonical; raises :class:`BadKeyError` for a rejected type."""
    kind = type(key)
    if kind in _PLAIN:
        return key
    if kind is float:
        return NAN if key != key else key
    if kind is tuple:
        items = [_canonical(x, index) for x in key]
        if all(a is b for a, b in zip(items, key)):
            return key
        return tuple(items)
    if isinstance(key, float) and _is_nan(key):
        return NAN
    reason = _verdict(key)
    if reason is not None:
        raise BadKeyError(index, key, reason)
    return key


def canonical_keys(keys: Sequence[Any], offset: int = 0) -> list[Any]:
    """``keys`` (as a list) with every NaN replaced by :data:`NAN`; raises
    :class:`~extagg.errors.BadKeyError` (index counted from ``offset``) at the first key of a
    rejected type. Plain ``int``/``str``/``bytes`` batches cost one C-level pass."""
    out = keys if isinstance(keys, list) else list(keys)
    kinds = set(map(type, out))
    if kinds <= _PLAIN:
        return out
    if kinds == {tuple}:
        inner = set(map(type, chain.from_iterable(out)))
        if inner <= _PLAIN:
            return out
        if inner <= _PLAIN_OR_FLOAT and not any(x != x for x in chain.from_iterable(out)):
            return out
    elif kinds <= _PLAIN_OR_FLOAT and not any(x != x for x in out):
        return out
    for i, key in enumerate(out):
        if type(key) in _PLAIN:
            continue
        try:
            canonical = _canonical(key, offset + i)
        except BadKeyError:
            raise
        except Exception as err:
            failure = BadKeyError(offset + i, key, f"checking the key raised {err!r}")
            raise failure from err
        if canonical is not key:
            out[i] = canonical
    return out
