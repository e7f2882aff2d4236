"""What a user's Python function computes, recognised from its code.

PySpark jobs pass their combiners as lambdas — ``reduceByKey(lambda a, b: a + b)``, a mean as
``combineByKey(lambda v: (v, 1), lambda c, v: (c[0] + v, c[1] + 1), lambda a, b: (a[0] +
b[0], a[1] + b[1]))`` — not as ``operator.add``. Such a function is the same computation as
a reference function when its bytecode, constants (compared with their types: ``1`` is not
``True`` nor ``1.0``) and global names are those of the reference, whatever its argument
names, and it has no closure, no ``*args``/``**kwargs`` and is no generator. The engines then
fold it in compiled code, with the very results Python gives (see :mod:`extagg.generic.typed_map`
and :mod:`extagg.merge.objects`); anything else keeps being called as given.

The references are compiled by the running interpreter, so the comparison holds on every
Python version.
"""

from __future__ import annotations

import inspect
import operator
import types
from collections.abc import Callable
from typing import Any

__all__ = ["computes_like", "is_identity", "is_plain_add"]

# what a function is beyond its code: *args, **kwargs, generators and coroutines
_KIND_FLAGS = (
    inspect.CO_VARARGS
    | inspect.CO_VARKEYWORDS
    | inspect.CO_GENERATOR
    | inspect.CO_COROUTINE
    | inspect.CO_ITERABLE_COROUTINE
    | inspect.CO_ASYNC_GENERATOR
)
_IDENTITY = lambda value: value  # noqa: E731 - the reference is the lambda users write
_PLAIN_ADD = lambda a, b: a + b  # noqa: E731


def _typed_constants(func: types.FunctionType) -> tuple[tuple[type, Any], ...]:
    consts = func.__code__.co_consts
    if consts and func.__doc__ is not None and consts[0] == func.__doc__:
        consts = (None, *consts[1:])  # a docstring takes the place a lambda's None has
    return tuple((type(c), c) for c in consts)


def computes_like(func: Any, reference: Callable[..., Any]) -> bool:
    """Whether ``func`` is a plain function with the code of ``reference``, itself a plain
    function (see the module)."""
    if func is reference:
        return True
    if type(func) is not types.FunctionType or type(reference) is not types.FunctionType:
        return False
    code, ref = func.__code__, reference.__code__
    return (
        code.co_code == ref.co_code
        and code.co_argcount == ref.co_argcount
        and code.co_kwonlyargcount == 0
        and not code.co_flags & _KIND_FLAGS
        and not code.co_freevars
        and not code.co_cellvars
        and code.co_names == ref.co_names
        and _typed_constants(func) == _typed_constants(reference)
    )


def is_identity(func: Any) -> bool:
    """Whether ``func(v)`` is ``v`` itself: code of ``lambda v: v``."""
    return computes_like(func, _IDENTITY)


def is_plain_add(func: Any) -> bool:
    """Whether ``func(a, b)`` is ``a + b`` and nothing else: ``operator.add``, or a plain
    function whose code is that of ``lambda a, b: a + b`` (whatever its argument names;
    no closure, no ``*args``). On two exact floats that is IEEE addition, on two exact ints
    exact addition, which the compiled folds compute bit for bit (or leave to Python)."""
    return func is operator.add or computes_like(func, _PLAIN_ADD)
