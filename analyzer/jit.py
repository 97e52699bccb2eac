"""herdscope's Numba: ``njit``, with cached kernels that load without Numba's compiler work.

Every kernel is ``@njit(cache=True)`` and imports ``njit`` from here. A run with a warm cache
compiles nothing, yet Numba (0.68) does compiler work on every kernel it loads from the cache.
Three steps of it are replaced here (issue 13: a process's fixed cost and the 1M scan's time):

- **The target's refresh.** ``Cache.load_overload`` calls ``target_context.refresh()`` first, which
  imports and registers every implementation Numba has (its ``cpython``, ``np``, ``typed``,
  ``random``, ``linalg`` and ``jitclass`` registries) so that the context could type and lower new
  code: ~0.12 s of a one-packet ``scan``. Loading cached code types and lowers nothing; what it needs
  is Numba's runtime (NRT) initialised, so that the loaded code finds ``NRT_MemInfo_alloc`` and the
  rest. :func:`_load_overload` initialises the runtime and loads.
- **Numba's own modules, for the environments.** A loaded library brings the environment of every
  function compiled into it, Numba's own included (``np.sort`` is ``numba.np.arrayobj``'s), and Numba
  rebuilds each over its module's globals, importing the module: ``numba.np.arrayobj`` and
  ``arraymath`` (which import ``linalg``), ``listobj`` and ``npyimpl``, ~60 ms of a one-packet
  ``scan`` that nothing else imports. Compiled nopython code reads an environment's constants, never
  its globals (only object mode's lowering does), so :func:`_rebuild_env` gives an environment of a
  Numba module not imported yet its constants over a dict holding only its ``__name__``.
- **The linking module.** A cached library is its object code plus the bitcode of a module for
  linking it into code compiled later. Numba parses that bitcode on every load and walks all of its
  functions and globals to learn which symbols the library defines (``JitEngine._defined_symbols``,
  asked before any address is looked up): ~5 ms a kernel, ~0.2 s of the 48 kernels a 1M scan
  loads. :func:`_unserialize` learns the defined symbols from the object code's ELF symbol table
  (:func:`elf_defined_symbols`) and keeps the bitcode unparsed until a compilation links the
  library into new code (:func:`_module_for_linking`), which a run with a warm cache never does.

Every kernel releases the GIL while it runs (:data:`KERNEL_OPTIONS`): a scan runs its decoders and its
detectors on several threads (``analyzer.threads``). Numba's cache index does not hold the options
a kernel was compiled with, so a cache written before they were set loads as it was (the GIL held)
until the kernel's source changes or the cache is emptied (the ``__pycache__`` directories, or
``NUMBA_CACHE_DIR``).

Numba itself is imported when the first kernel's dispatcher is made (:func:`numba_module`), not when a
module defining kernels is: a command that calls none (``herdscope detectors``, which imports every
detector, and ``--help``) does not pay for it (~0.1 s). What a kernel's code names that needs Numba to
exist (an ``@intrinsic``) is made then too (:func:`lazy_global`).

The refresh and the environments' imports are skipped for herdscope's own kernels only (functions
decorated by :func:`njit` here, in one step: ``INSTALLED["refresh"]``):
other cached Numba code in the same process (a ``@vectorize(cache=True)`` ufunc, whose loop wrapper
is built after the load from the tables the refresh installs) loads the way Numba loads it. A kernel
that is not in the cache (a new signature, a changed source) compiles through ``CompilerBase``, which
refreshes both contexts itself; linking a loaded library into it parses its bitcode then.

All three depend on Numba's private classes, so they are installed only on the Numba versions they
were checked on (:data:`CHECKED_NUMBA`, and only where those classes look as expected), and a
library whose object code is not 64-bit little-endian ELF (not Linux) or defines no symbol loads the
way Numba loads it. ``HERDSCOPE_NUMBA_LOAD=plain`` in the environment leaves them to Numba (to
compare, or to rule these out).
"""
from __future__ import annotations

import functools
import importlib
import os
import struct
import sys
import threading

__all__ = ["njit", "Kernel", "KERNEL_OPTIONS", "INSTALLED", "CHECKED_NUMBA", "elf_defined_symbols", "lazy_global", "numba_module"]

# Numba itself is imported when the first kernel's dispatcher is made (numba_module), not with this
# module: ~0.1 s that a command calling no kernel (``herdscope detectors``, ``--help``) does not pay
numba = caching = codegen = environment = nrt = None

PLAIN_LOAD_ENV = "HERDSCOPE_NUMBA_LOAD"  # "plain": kernels load the way Numba loads them
# (lowest, highest) (major, minor) of the Numba releases whose caching and codegen classes the two
# steps were checked against (their sources read, tests/test_jit.py run); outside it, Numba loads
_CHECKED_FROM, _CHECKED_TO = (0, 68), (0, 68)
CHECKED_NUMBA = f"{_CHECKED_FROM[0]}.{_CHECKED_FROM[1]} to {_CHECKED_TO[0]}.{_CHECKED_TO[1]}"
_KERNEL_MARK = "_herdscope_kernel"  # set on the Python function of every kernel decorated here
# what every kernel is compiled with unless its decorator says otherwise: it releases the GIL while it
# runs, so the steps that analyzer.threads runs at once run their kernels at once (a kernel reads its
# arguments and writes arrays it was given or made; none touches a Python object)
KERNEL_OPTIONS = {"nogil": True}


def njit(*args, **options):
    """``numba.njit`` with :data:`KERNEL_OPTIONS`, marking the function as one of herdscope's kernels
    (whose cached code loads without the target's refresh, module doc), its dispatcher made on first
    use (:class:`Kernel`; Numba imported then). Used as ``@njit`` or ``@njit(cache=True, ...)``."""
    if len(args) == 1 and callable(args[0]) and not options:
        setattr(args[0], _KERNEL_MARK, True)
        return Kernel(args[0], lambda function: numba_module().njit(**KERNEL_OPTIONS)(function))

    def decorate(function):
        return numba_module().njit(*args, **{**KERNEL_OPTIONS, **options})(function)

    def mark_and_decorate(function):
        setattr(function, _KERNEL_MARK, True)
        return Kernel(function, decorate)
    return mark_and_decorate


_LAZY_GLOBALS: list[tuple[dict, str, object]] = []  # (a module's globals, name, maker) made with Numba
_importing = threading.RLock()  # held while Numba is imported and the steps installed


def lazy_global(namespace: dict, name: str, make) -> None:
    """Set ``namespace[name]`` to ``make()`` once Numba is imported (:func:`numba_module`), before any
    kernel's dispatcher is made: what a kernel's code names that needs Numba to be made (an
    ``@intrinsic``: ``analyzer.kernels.wire``). At once if Numba is imported already."""
    with _importing:
        if numba is not None:
            namespace[name] = make()
        else:
            _LAZY_GLOBALS.append((namespace, name, make))


def numba_module():
    """Numba, imported on first use: the steps of the module doc installed, the lazy globals made."""
    global numba, caching, codegen, environment, nrt, _numba_rebuild_env, _installed
    if numba is not None:
        return numba
    with _importing:
        if numba is None:
            import numba as numba_package  # lazy: ~0.1 s a command calling no kernel does not pay (module doc)
            from numba.core import caching as caching_module, codegen as codegen_module  # lazy: with Numba
            from numba.core import environment as environment_module  # lazy: with Numba
            from numba.core.runtime import nrt as nrt_module  # lazy: with Numba
            if _installed is None:  # once, even if a lazy global failed to be made last time
                caching, codegen, environment, nrt = caching_module, codegen_module, environment_module, nrt_module
                _numba_rebuild_env = environment._rebuild_env
                _installed = _install(numba_package)
            while _LAZY_GLOBALS:
                namespace, name, make = _LAZY_GLOBALS[0]
                namespace[name] = make()
                _LAZY_GLOBALS.pop(0)
            numba = numba_package
    return numba


class Kernel:
    """A kernel whose Numba dispatcher is made the first time it is called, typed by code compiled to
    call it (``_numba_type_``, what ``numba.typeof`` asks) or asked for any of its attributes
    (``signatures``, ``stats``, ``targetoptions``...). Making a dispatcher with ``cache=True`` finds
    and checks its cache: ~0.2 ms a kernel, ~50 ms for the ~230 kernels a scan imports, of which a
    one-packet scan calls about ten (issue 13: a process's fixed cost). It carries the function's
    name, module and docstring (``functools.update_wrapper``); threads calling it first at once make
    one dispatcher."""

    _making = threading.Lock()  # held while a dispatcher is made

    def __init__(self, function, decorate):
        self.py_func, self._decorate, self._dispatcher = function, decorate, None
        functools.update_wrapper(self, function)

    @property
    def dispatcher(self):
        """Numba's dispatcher of the kernel, made on first use."""
        if self._dispatcher is None:
            with Kernel._making:
                if self._dispatcher is None:
                    self._dispatcher = self._decorate(self.py_func)
        return self._dispatcher

    def __call__(self, *args, **kwargs):
        return self.dispatcher(*args, **kwargs)

    @property
    def _numba_type_(self):
        return self.dispatcher._numba_type_

    def __getattr__(self, name):
        if name in ("py_func", "_decorate", "_dispatcher"):  # not set yet (unpickling, copying)
            raise AttributeError(name)
        return getattr(self.dispatcher, name)

    def __reduce__(self):  # pickled by name, as Numba's dispatchers of module-level functions are
        return _kernel_named, (self.py_func.__module__, self.py_func.__qualname__)

    def __repr__(self) -> str:
        return f"Kernel({self.py_func.__module__}.{self.py_func.__qualname__})"


def _kernel_named(module: str, qualname: str):
    target = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


# ELF (System V gABI): the header fields and section and symbol entries read here
_ELF_MAGIC = b"\x7fELF"
_ELFCLASS64, _ELFDATA2LSB = 2, 1
_SECTION_HEADER = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym
_SHT_SYMTAB = 2
_SHN_UNDEF = 0
_STT_SECTION, _STT_FILE = 3, 4  # symbol types that name no code or data


def elf_defined_symbols(object_code: bytes) -> set[str] | None:
    """The names of the symbols ``object_code`` defines (its symbol table's entries with a section,
    other than section and file symbols), or None when it is not a 64-bit little-endian ELF object
    whose tables lie within it, or defines nothing (then Numba's own scan is used)."""
    data = memoryview(object_code)
    if len(data) < 64 or bytes(data[:4]) != _ELF_MAGIC or data[4] != _ELFCLASS64 or data[5] != _ELFDATA2LSB:
        return None
    (section_offset,) = struct.unpack_from("<Q", data, 0x28)
    entry_size, count = struct.unpack_from("<HH", data, 0x3A)
    if entry_size < _SECTION_HEADER.size or section_offset + count * entry_size > len(data):
        return None
    sections = [_SECTION_HEADER.unpack_from(data, section_offset + i * entry_size) for i in range(count)]
    names: set[str] = set()
    found = False
    for _name, kind, _flags, _addr, offset, size, link, _info, _align, sym_size in sections:
        if kind != _SHT_SYMTAB:
            continue
        if sym_size < _SYMBOL.size or offset + size > len(data) or link >= count:
            return None
        strings_offset, strings_size = sections[link][4], sections[link][5]
        if strings_offset + strings_size > len(data):
            return None
        strings = bytes(data[strings_offset:strings_offset + strings_size])
        found = True
        for at in range(offset, offset + size - sym_size + 1, sym_size):
            name_at, info, _other, section, _value, _size = _SYMBOL.unpack_from(data, at)
            if section == _SHN_UNDEF or name_at == 0 or (info & 0xF) in (_STT_SECTION, _STT_FILE):
                continue
            end = strings.find(b"\0", name_at)
            if end < 0:
                return None
            names.add(strings[name_at:end].decode("utf-8", "replace"))
    return names if found and names else None


_numba_load_overload = None  # Cache.load_overload as Numba defines it
_numba_rebuild_env = None  # environment._rebuild_env as Numba defines it (numba_module)


def _load_overload(self, sig, target_context):
    """``Cache.load_overload`` of a herdscope kernel without the registries' refresh: the runtime,
    then Numba's own load. Any other function's: Numba's ``load_overload``."""
    if not getattr(getattr(self, "_py_func", None), _KERNEL_MARK, False):
        return _numba_load_overload(self, sig, target_context)
    nrt.rtsys.initialize(target_context)
    numba_rebuild_env = environment._rebuild_env  # what the cached data's pickle names (module doc)
    environment._rebuild_env = _rebuild_env
    try:
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)
    finally:
        environment._rebuild_env = numba_rebuild_env


_NUMBA_PACKAGE = "numba."


def _rebuild_env(modname, consts, env_name):
    """``environment._rebuild_env`` while a herdscope kernel loads: the environment of a function of
    one of Numba's modules not imported yet is rebuilt without importing it (module doc)."""
    if modname in sys.modules or not str(modname).startswith(_NUMBA_PACKAGE):
        return _numba_rebuild_env(modname, consts, env_name)
    env = environment.lookup_environment(env_name)
    if env is not None:
        return env
    env = environment.Environment({"__name__": modname})
    env.consts[:] = consts
    env.env_name = env_name
    environment.Environment._memo[env_name] = env
    return env


_numba_unserialize = None  # CPUCodeLibrary._unserialize as Numba defines it
_numba_module_for_linking = None  # CPUCodeLibrary._get_module_for_linking as Numba defines it


def _unserialize(cls, codegen_, state):
    """``CPUCodeLibrary._unserialize`` of an object-code library: the library from its object code,
    its symbols from the object's ELF symbol table, its linking bitcode kept unparsed."""
    name, kind, data = state
    if kind != "object":
        return _numba_unserialize(cls, codegen_, state)
    object_code, shared_bitcode = data
    defined = elf_defined_symbols(object_code)
    if defined is None:
        return _numba_unserialize(cls, codegen_, state)
    self = codegen_.create_library(name)
    self.enable_object_caching()
    self._set_compiled_object(object_code)
    self._herdscope_linking_bitcode = shared_bitcode
    self._finalize_final_module()
    codegen_._engine._defined_symbols |= defined
    return self


def _module_for_linking(self):
    """``CPUCodeLibrary._get_module_for_linking``, parsing a loaded library's bitcode on first use."""
    bitcode = getattr(self, "_herdscope_linking_bitcode", None)
    if self._shared_module is None and bitcode is not None:
        self._ensure_finalized()
        self._shared_module = codegen.ll.parse_bitcode(bitcode)
        self._herdscope_linking_bitcode = None
    return _numba_module_for_linking(self)


def numba_version_checked(version: str) -> bool:
    """Whether Numba ``version`` ("0.68.1") is within :data:`CHECKED_NUMBA`."""
    try:
        major_minor = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        return False
    return _CHECKED_FROM <= major_minor <= _CHECKED_TO


def _install(numba_package) -> dict[str, bool]:
    """Install what Numba's version and classes allow; which steps were installed."""
    global _numba_load_overload, _numba_unserialize, _numba_module_for_linking
    done = {"refresh": False, "linking module": False}
    if (os.environ.get(PLAIN_LOAD_ENV, "").strip().lower() == "plain"
            or not numba_version_checked(numba_package.__version__)):
        return done
    cache = getattr(caching, "Cache", None)
    if (cache is not None and all(hasattr(cache, n) for n in ("load_overload", "_load_overload",
                                                               "_guard_against_spurious_io_errors"))
            and hasattr(getattr(nrt, "rtsys", None), "initialize")
            and all(hasattr(environment, n) for n in ("_rebuild_env", "lookup_environment", "Environment"))):
        _numba_load_overload = cache.load_overload
        cache.load_overload = _load_overload
        done["refresh"] = True
    library = getattr(codegen, "CPUCodeLibrary", None)
    engine = getattr(codegen, "JitEngine", None)
    needed = ("_unserialize", "_get_module_for_linking", "enable_object_caching", "_set_compiled_object",
              "_finalize_final_module", "_ensure_finalized")
    if (library is not None and engine is not None and all(hasattr(library, n) for n in needed)
            and hasattr(engine, "is_symbol_defined")):
        _numba_unserialize = library._unserialize.__func__
        _numba_module_for_linking = library._get_module_for_linking
        library._unserialize = classmethod(_unserialize)
        library._get_module_for_linking = _module_for_linking
        done["linking module"] = True
    return done


_installed: dict[str, bool] | None = None  # what _install did, once Numba is imported


def __getattr__(name: str):
    if name == "INSTALLED":  # which steps were installed (module doc): Numba imported to say
        numba_module()
        return _installed
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
