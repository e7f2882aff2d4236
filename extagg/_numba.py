"""The numba settings of every compiled kernel, in one place.

Every ``_kernels``-style module compiles its functions with :func:`jit`:

* ``cache=True`` - compiled code is cached next to the module (``__pycache__``), so a new
  process loads the kernels instead of compiling them again (seconds per module);
* ``nogil=True`` - kernels release the GIL, so threads can run them side by side;
* ``fastmath=False`` - float sums, means and variances must match the pure-Python references
  bit for bit and keep IEEE NaN/inf semantics, which fast-math reassociation would break;
* ``boundscheck`` left to numba's ``NUMBA_BOUNDSCHECK`` environment variable (off by default,
  for speed): set ``NUMBA_BOUNDSCHECK=1`` to debug a kernel with checked indexing.

Besides the decorator, the helpers the kernels of the hash tables use:
:func:`prefetch` (start loading a cache line ahead of its use), 8-byte loads and stores at
any byte offset of a ``uint8`` array (:data:`load_f64`, :data:`store_f64`, ... : the fields of
a packed record row, which need not be aligned), and :func:`copy_bytes` and
:func:`same_bytes` built on them.

numba fills global registries (boxing, lowering) the first time it is imported and the first
time its CPU target compiles; Ctrl-C in the middle leaves them half-filled, and every later
compile in the process fails (``KeyError: duplicate registration for UnicodeType``). So this
module imports numba, and fills the CPU target's registries (:func:`ensure_target`), with
Ctrl-C held back until done (:class:`extagg._interrupts.deferred_interrupts`): an interrupt
then arrives after the load, and the next call simply works.

*Loading a cached kernel does not fill them.* numba's cache fills every lowering and typing
registry of its CPU target before it loads a kernel (``target_context.refresh()``: ~0.14 s and
~43 MiB on this project's machine, a fifth of a small query's whole run), though a cached
kernel is machine code linked into the JIT, and nothing of those registries is used to load
or call it. Each kernel's cache is therefore a :class:`_KernelCache`, which loads without
them and fills them (:func:`ensure_target`) only when a kernel is not in the cache and is
about to be compiled — the compiler would fill them itself, but not with Ctrl-C held back.

*Nor does it compile numba's runtime.* numba initialises its runtime (NRT: reference counts and
allocation, which most kernels call) by compiling a small LLVM module at every process start:
27 ms and 27 MiB of LLVM's optimiser and code generator paged in (measured), for code that is
the same every time. :func:`_ensure_runtime` keeps that module's object code beside the
kernels' own cache, keyed as numba keys its caches (numba's and llvmlite's versions, the CPU
and its features), and loads it as numba loads a cached kernel: 3.5 ms and 9 MiB. A file that
is missing, of another key, truncated or altered (a checksum) is compiled again and
rewritten (a temp file renamed into place: processes starting side by side, as PySpark's
workers do, each write a whole file).

*Nor does it import the modules of numba's own implementations.* A cached kernel that calls
``np.empty`` (most of them) names, in its pickled environments, the module of numba's
implementation of it, ``numba.np.arrayobj``, which numba's loader imports to give that
environment its globals: 0.18-0.5 s (it imports ``numba.cpython.charseq`` and ``unicode``
with their hundreds of overloads), a fifth of a small query's start. An environment's
globals serve object-mode code only, which these kernels never have (``njit``), so
:class:`_KernelCache` gives an environment of a module not yet imported its name alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import logging
import os
import struct
import sys
import tempfile
import zlib
from collections.abc import Callable
from typing import Any, TypeVar

from extagg._interrupts import compiling, deferred_interrupts

with deferred_interrupts():
    import numba
    from numba.core import environment as numba_environment
    from numba.core.caching import FunctionCache
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.registry import cpu_target
    from numba.core.runtime import nrtdynmod, rtsys

    #: the runtime's C helpers (a C extension, which mypy cannot see into)
    _nrt_python: Any = importlib.import_module("numba.core.runtime._nrt_python")

import llvmlite  # type: ignore[import-untyped]
from llvmlite import binding as llvm_binding
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

__all__ = [
    "CACHE", "FASTMATH", "NOGIL", "ensure_target", "jit", "prefetch",
    "load_f64", "store_f64", "load_i64", "store_i64", "load_u64", "store_u64",
    "copy_bytes", "same_bytes",
]  # fmt: skip

CACHE = True
NOGIL = True
FASTMATH = False

F = TypeVar("F", bound=Callable[..., Any])


_target_ready: list[bool] = []
_runtime_ready: list[bool] = []


log = logging.getLogger(__name__)


def _ensure_runtime(target_context: Any, cache_dir: str | None = None) -> None:
    """numba's runtime (NRT: the kernels allocate arrays with it), initialised once, Ctrl-C
    held back; from its object code cached in ``cache_dir`` when there (see the module
    docstring). Filling the registries would initialise it too (compiled)."""
    if _runtime_ready:
        return
    with deferred_interrupts(), global_compiler_lock:
        if not _runtime_ready:
            stats = getattr(numba.config, "NRT_STATS", False)  # compiled with counters
            if cache_dir is not None and not stats and getattr(rtsys, "_init", None) is False:
                try:
                    _initialize_runtime(target_context, cache_dir)
                except Exception:  # numba's internals changed: its own way below
                    log.debug("numba's runtime not loaded from its cache", exc_info=True)
            rtsys.initialize(target_context)  # nothing left to do when loaded above
            _runtime_ready.append(True)


#: the first bytes of a cached runtime (then the library's name, its object code and its
#: bitcode, each after its length, and a CRC-32 of all before it)
_NRT_MAGIC = b"extagg-nrt\x01"


def _runtime_cache_file(cache_dir: str, codegen: Any) -> str:
    """Where the runtime's object code for this numba, llvmlite and CPU is kept."""
    key = repr((numba.__version__, llvmlite.__version__, codegen.magic_tuple()))
    return os.path.join(cache_dir, f"extagg-nrt-{hashlib.sha256(key.encode()).hexdigest()[:16]}.o")


def _initialize_runtime(target_context: Any, cache_dir: str) -> None:
    """What ``rtsys.initialize`` does — register the runtime's C helpers, then make its LLVM
    functions — with the functions loaded from their cached object code when it is there,
    and compiled and cached when not."""
    for name, address in _nrt_python.c_helpers.items():
        llvm_binding.add_symbol(name if name.startswith("_") else "NRT_" + name, address)
    codegen = target_context.codegen()
    path = _runtime_cache_file(cache_dir, codegen)
    state = _read_runtime(path)
    library = None
    if state is not None:
        try:
            library = codegen.unserialize_library(state)
        except Exception:  # an object numba cannot load: compiled below, the file replaced
            log.debug("cannot load numba's runtime from %s", path, exc_info=True)
    if library is None:
        ir_module, library = nrtdynmod.create_nrt_module(target_context)
        library.enable_object_caching()
        library.add_ir_module(ir_module)
        library.finalize()
        _write_runtime(path, library.serialize_using_object_code())
    rtsys._library = library
    rtsys._init = True


def _read_runtime(path: str) -> tuple[str, str, tuple[bytes, bytes]] | None:
    """The serialized runtime library in ``path``; None if it is missing or not whole."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if len(data) < len(_NRT_MAGIC) + 4 or not data.startswith(_NRT_MAGIC):
        return None
    body, (crc,) = data[:-4], struct.unpack(">I", data[-4:])
    if zlib.crc32(body) != crc:
        return None
    parts, pos = [], len(_NRT_MAGIC)
    for _ in range(3):
        if pos + 8 > len(body):
            return None
        (size,) = struct.unpack_from(">Q", body, pos)
        parts.append(body[pos + 8 : pos + 8 + size])
        pos += 8 + size
    if pos != len(body):
        return None
    name, object_code, bitcode = parts
    return name.decode("utf-8", "replace"), "object", (object_code, bitcode)


def _write_runtime(path: str, state: tuple[str, str, tuple[bytes, bytes]]) -> None:
    """Keep the serialized runtime in ``path`` (whole or not at all); a folder that cannot be
    written only means the next process compiles it again."""
    name, _kind, (object_code, bitcode) = state
    body = _NRT_MAGIC + b"".join(
        struct.pack(">Q", len(part)) + part for part in (name.encode(), object_code, bitcode)
    )
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".extagg-nrt-")
        os.fchmod(fd, 0o644)  # as numba's own cache files (mkstemp's are 0600)
        with os.fdopen(fd, "wb") as f:
            f.write(body + struct.pack(">I", zlib.crc32(body)))
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        log.debug("cannot cache numba's runtime in %s: %s", path, exc)
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def ensure_target() -> None:
    """Fill numba's CPU target registries (lowering, typing) once, Ctrl-C held back: before
    anything is compiled (see the module docstring)."""
    if _target_ready:
        return
    with deferred_interrupts():
        cpu_target.target_context.refresh()
        _target_ready.append(True)


_rebuild_env = numba_environment._rebuild_env


def _rebuild_env_without_import(modname: str | None, consts: Any, env_name: str) -> Any:
    """numba's ``_rebuild_env`` (what unpickling a cached kernel's environment calls), with
    the environment of a module not imported yet given only the module's name as globals,
    instead of importing the module (see the module docstring)."""
    if modname is None or modname in sys.modules:
        return _rebuild_env(modname, consts, env_name)
    env = numba_environment.lookup_environment(env_name)
    if env is not None:
        return env
    env = numba_environment.Environment({"__name__": modname})
    env.consts[:] = consts
    env.env_name = env_name
    numba_environment.Environment._memo[env_name] = env
    return env


class _KernelCache(FunctionCache):
    """numba's on-disk cache of one kernel, loading without the CPU target's registries
    (``FunctionCache.load_overload`` fills them first) and without importing the modules its
    environments name; on a miss it fills the registries, since the caller compiles next."""

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        _ensure_runtime(target_context, self.cache_path)
        cres = None
        with self._guard_against_spurious_io_errors():
            # numba loads under its compiler lock: no other load sees the swap
            numba_environment._rebuild_env = _rebuild_env_without_import
            try:
                cres = self._load_overload(sig, target_context)
            finally:
                numba_environment._rebuild_env = _rebuild_env
        if cres is None:
            ensure_target()
        return cres


def _interrupts_held(compile_kernel: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A kernel's ``compile`` (what its first call with new types runs: load from the disk
    cache, or compile) with Ctrl-C held back to its end. llvmlite frees an LLVM object, then
    marks it freed: a ``KeyboardInterrupt`` between the two left it to be freed again when
    collected, and the process aborted ("Fatal Python error: Aborted", a double free) instead
    of stopping cleanly; seen with a Ctrl-C while a cached kernel loaded. The command line
    does not wait for a cold compile's end: it leaves at once (``_interrupts.compiling``)."""

    def compile_held(sig: Any) -> Any:
        with deferred_interrupts(), compiling():
            return compile_kernel(sig)

    return compile_held


def jit(**overrides: Any) -> Callable[[F], F]:
    """``numba.njit`` with the project's settings (``overrides``, e.g. ``inline="always"``,
    are added; they may not change the settings above)."""
    clash = {"cache", "nogil", "fastmath"} & overrides.keys()
    if clash:
        raise TypeError(f"jit() settings are fixed in extagg._numba: {sorted(clash)}")
    njit = numba.njit(cache=CACHE, nogil=NOGIL, fastmath=FASTMATH, **overrides)

    def decorate(func: F) -> F:
        kernel = njit(func)
        if isinstance(getattr(kernel, "_cache", None), FunctionCache):
            kernel._cache = _KernelCache(kernel.py_func)
        else:  # not cached on disk (numba found no cache folder): every call compiles
            ensure_target()
        kernel.compile = _interrupts_held(kernel.compile)
        return kernel

    return decorate


def _prefetch(typingctx: Any, array: Any, index: Any) -> Any:
    """``prefetch(array, i)`` in a kernel: ask the CPU to start loading the cache line of
    ``array[i]`` (of row ``i`` of a 2-D array) for a write soon, and go on.

    A hint, not a load: it never faults and changes no result (the kernels' plain-Python
    references simply have no such line), so ``i`` may be anything the kernel would index
    with. Probing a hash table misses the cache on nearly every row; issuing the miss of the
    row some distance ahead lets several misses overlap instead of paying them one by one
    (LLVM's ``llvm.prefetch``, read/write = write, locality = 3, data cache)."""
    if not isinstance(array, types.Array) or not isinstance(index, types.Integer):
        return None
    sig = types.void(array, index)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        aryty, idxty = signature.args
        ary = context.make_array(aryty)(context, builder, args[0])
        first = context.cast(builder, args[1], idxty, types.intp)
        zero = context.get_constant(types.intp, 0)
        ptr = cgutils.get_item_pointer(
            context, builder, aryty, ary, [first] + [zero] * (aryty.ndim - 1), wraparound=False
        )
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(1), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


prefetch: Callable[..., None] = intrinsic(_prefetch)


def _memory_access(nbtype: Any) -> tuple[Any, Any]:
    """``(load, store)`` intrinsics of one ``nbtype`` value at a byte offset of a ``uint8``
    array, aligned or not (``load(buf, offset)``, ``store(buf, offset, value)``)."""

    def pointer(context: Any, builder: Any, aryty: Any, ary_value: Any, offty: Any, off: Any):
        ary = context.make_array(aryty)(context, builder, ary_value)
        offset = context.cast(builder, off, offty, types.intp)
        ptr = builder.gep(ary.data, [offset])
        return builder.bitcast(ptr, context.get_value_type(nbtype).as_pointer())

    @intrinsic
    def load(typingctx: Any, buf: Any, offset: Any) -> Any:
        if not (isinstance(buf, types.Array) and buf.dtype == types.uint8):
            return None
        if not isinstance(offset, types.Integer):
            return None

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            aryty, offty = signature.args
            ptr = pointer(context, builder, aryty, args[0], offty, args[1])
            return builder.load(ptr, align=1)

        return nbtype(buf, offset), codegen

    @intrinsic
    def store(typingctx: Any, buf: Any, offset: Any, value: Any) -> Any:
        if not (isinstance(buf, types.Array) and buf.dtype == types.uint8):
            return None
        if not isinstance(offset, types.Integer):
            return None

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            aryty, offty, valty = signature.args
            ptr = pointer(context, builder, aryty, args[0], offty, args[1])
            builder.store(context.cast(builder, args[2], valty, nbtype), ptr, align=1)
            return context.get_dummy_value()

        return types.void(buf, offset, value), codegen

    return load, store


#: loads and stores of 8-byte values at any byte offset of a ``uint8`` array (a packed record
#: row's fields, which need not be aligned): what a field view would do, without a view per field
load_f64, store_f64 = _memory_access(types.float64)
load_i64, store_i64 = _memory_access(types.int64)
load_u64, store_u64 = _memory_access(types.uint64)


@jit(inline="always")
def copy_bytes(dst: Any, at: int, src: Any, start: int, n: int) -> None:
    """``dst[at:at + n] = src[start:start + n]`` (``uint8`` arrays) in a kernel, 8 bytes a
    step: a byte loop over another array cannot be vectorised (numba cannot rule out that
    the two overlap), and strings are copied by the million (gathers, arenas)."""
    j = 0
    while j + 8 <= n:
        store_u64(dst, at + j, load_u64(src, start + j))
        j += 8
    while j < n:
        dst[at + j] = src[start + j]
        j += 1


@jit(inline="always")
def same_bytes(a: Any, at: int, b: Any, start: int, n: int) -> bool:
    """``a[at:at + n] == b[start:start + n]`` (``uint8`` arrays) in a kernel, 8 bytes a step."""
    j = 0
    while j + 8 <= n:
        if load_u64(a, at + j) != load_u64(b, start + j):
            return False
        j += 8
    while j < n:
        if a[at + j] != b[start + j]:
            return False
        j += 1
    return True
