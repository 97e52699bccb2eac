"""analyzer.jit: kernels loaded from Numba's cache without Numba's compiler work (issue 13).

The defined symbols of a library come from its object code's ELF symbol table instead of its parsed
linking module; the tests hold them to the module's, and check that code compiled later still links a
kernel loaded that way (its bitcode parsed on first use).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from numba import njit
from numba.core import codegen

import analyzer
from analyzer import jit

ROOT = Path(__file__).resolve().parent.parent


def _module_symbols(bitcode: bytes) -> set[str]:
    """What Numba's own load finds a library defines (JitEngine._load_defined_symbols)."""
    module = codegen.ll.parse_bitcode(bitcode)
    return {g.name for group in (module.functions, module.global_variables) for g in group
            if not g.is_declaration}


@njit
def _allocates(values):
    total = 0
    for v in values:
        total += v
    return np.zeros(total, np.int64)


fast_loading = pytest.mark.skipif(
    not (analyzer.CACHE_KEPT and all(jit.INSTALLED.values())),
    reason="kernels load the way Numba loads them here (HERDSCOPE_NUMBA_LOAD=plain, a Numba outside "
           f"{jit.CHECKED_NUMBA}), or no cache is kept between processes")


@fast_loading
def test_installed_on_this_numba():
    assert jit.INSTALLED == {"refresh": True, "linking module": True}


@pytest.mark.parametrize("version, checked", [("0.68.1", True), ("0.68.0rc1", True), ("0.69.0", False),
                                              ("0.58.1", False), ("1.0", False), ("dev", False)])
def test_numba_versions_checked(version, checked):
    assert jit.numba_version_checked(version) is checked


def test_only_herdscope_kernels_are_marked():
    @jit.njit(cache=False)
    def ours(x):
        return x + 1

    @njit
    def theirs(x):
        return x + 1

    assert getattr(ours.py_func, jit._KERNEL_MARK, False) and ours(1) == 2
    assert not hasattr(theirs.py_func, jit._KERNEL_MARK)


def test_a_kernels_dispatcher_is_made_once_on_first_use():
    """jit.Kernel: nothing made at decoration; threads using it first at once share one dispatcher; it
    reads as its function (name, docstring) and pickles by name."""
    import pickle
    import threading

    made = []

    def counting(function):
        made.append(function)
        return njit(function)

    def add_one(x):
        """One more."""
        return x + 1

    kernel = jit.Kernel(add_one, counting)
    assert made == [] and kernel.__name__ == "add_one" and kernel.__doc__ == "One more."
    barrier, got = threading.Barrier(4), []

    def first_use():
        barrier.wait()
        got.append(kernel.dispatcher)

    threads = [threading.Thread(target=first_use) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and all(d is got[0] for d in got) and kernel(1) == 2
    from analyzer.kernels.silences import silence_kept
    assert pickle.loads(pickle.dumps(silence_kept)) is silence_kept


def test_elf_symbols_are_the_linking_module_symbols():
    _allocates(np.arange(3))
    result = _allocates.overloads[_allocates.signatures[0]]
    _name, kind, (object_code, bitcode) = result.library.serialize_using_object_code()
    assert kind == "object"
    defined = jit.elf_defined_symbols(object_code)
    assert defined == _module_symbols(bitcode)
    assert {result.fndesc.llvm_func_name, result.fndesc.llvm_cpython_wrapper_name} <= defined


@pytest.mark.parametrize("damage", ["not elf", "32-bit", "big-endian", "sections past the end", "cut"])
def test_elf_symbols_of_damaged_object_code_is_none(damage):
    _allocates(np.arange(3))
    result = _allocates.overloads[_allocates.signatures[0]]
    object_code = bytearray(result.library.serialize_using_object_code()[2][0])
    if damage == "not elf":
        object_code[:4] = b"\x00ELF"
    elif damage == "32-bit":
        object_code[4] = 1
    elif damage == "big-endian":
        object_code[5] = 2
    elif damage == "sections past the end":
        object_code[0x28:0x30] = (len(object_code) - 8).to_bytes(8, "little")
    else:
        object_code = object_code[:40]
    assert jit.elf_defined_symbols(bytes(object_code)) is None


# Run in a fresh interpreter twice (the first may compile and cache): the kernel is loaded from the
# cache, then a function compiled in that process calls it, which links the loaded library.
_LINK_LOADED = """
import sys
import numpy as np
from numba import njit
from analyzer.decoders.text import _string_views
from analyzer import jit
data = np.frombuffer(b"abcdefghijklmnopq", np.uint8)
offsets = np.array([0, 3, 17], np.int64)
lengths = np.array([3, 14], np.int64)
views = np.zeros((2, 16), np.uint8)
_string_views(data, offsets, lengths, views)
library = _string_views.overloads[_string_views.signatures[0]].library
lazy = getattr(library, "_herdscope_linking_bitcode", None) is not None

@njit
def calls_it(data, offsets, lengths, views):
    _string_views(data, offsets, lengths, views)
    return views[0, 0] + views[1, 0]

out = np.zeros((2, 16), np.uint8)
print(_string_views.stats.cache_hits.get(_string_views.signatures[0], 0), lazy, int(calls_it(data, offsets, lengths, out)),
      bytes(views[0, 4:7]).decode(), (out == views).all())
"""


@fast_loading
def test_code_compiled_later_links_a_kernel_loaded_from_the_cache():
    env = {k: v for k, v in os.environ.items() if k != jit.PLAIN_LOAD_ENV}
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", _LINK_LOADED], capture_output=True, text=True, cwd=ROOT,
                              env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr
    hits, lazy, total, first, same = proc.stdout.split()
    assert int(hits) == 1 and lazy == "True"  # loaded from the cache, its linking module not yet parsed
    assert int(total) == 3 + 14 and first == "abc" and same == "True"


# A kernel whose library holds Numba's own array functions (np.zeros, slice assignment: numba.np.arrayobj),
# loaded from the cache without importing those modules; then code compiled in the same process that
# needs them imports them, and both run.
_NUMBA_MODULES_NOT_IMPORTED = """
import sys
import numpy as np
from numba import njit
from analyzer.kernels.silences import silence_kept
ts = np.array([1, 2, 3, 10, 11], np.int64)
first = silence_kept(ts, np.int64(5)).tolist()
imported = "numba.np.arrayobj" in sys.modules

@njit
def later(ts, gap):
    out = np.zeros(ts.shape[0] + 1, np.int64)
    out[1:] = ts
    return silence_kept(out[1:], gap)

print(silence_kept.stats.cache_hits.get(silence_kept.signatures[0], 0), imported, first == [True, False, True, True, True],
      later(ts, np.int64(5)).tolist() == first, silence_kept(ts[::-1].copy(), np.int64(5)).all())
"""


@fast_loading
def test_a_loaded_kernel_does_not_import_numbas_own_modules_for_its_environments():
    env = {k: v for k, v in os.environ.items() if k != jit.PLAIN_LOAD_ENV}
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", _NUMBA_MODULES_NOT_IMPORTED], capture_output=True, text=True,
                              cwd=ROOT, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "False", "True", "True", "True"]


_UFUNC = """
from numba import vectorize

@vectorize(["float64(float64)"], cache=True)
def half(x):
    return x / 2.0
"""


def test_other_cached_numba_code_loads_as_numba_loads_it(tmp_path):
    """A cached @vectorize ufunc in a process that imported analyzer.jit: its loop wrapper is built
    after the load from the tables the target's refresh installs, so its load keeps the refresh (on a
    warm load without it, Numba raises NumbaNotImplementedError)."""
    (tmp_path / "ufunc_module.py").write_text(_UFUNC)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import analyzer.jit; import numpy as np; "
            "from ufunc_module import half; print(half(np.array([3.0]))[0])")
    env = {k: v for k, v in os.environ.items() if k != jit.PLAIN_LOAD_ENV}
    env["NUMBA_CACHE_DIR"] = str(tmp_path / "numba-cache")
    for _ in range(2):  # compile and cache, then load
        proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                              cwd=ROOT, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == "1.5"
