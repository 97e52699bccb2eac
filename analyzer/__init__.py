"""herdscope's analyzer: reading captures into Polars frames and understanding them.

    from analyzer import open_capture
    with open_capture("trace.pcapng") as cap:
        cap.packets          # one row per record (see analyzer.schema)
        cap.report           # damage, skips and events met while reading

Importing the package imports nothing heavy: ``Capture``, ``open_capture`` and ``open_captures`` load
the reader (and its Numba kernels) on first use, so ``herdscope --help`` and ``--version`` compile
nothing.

The kernels are ``@njit(cache=True)``. Numba stores compiled kernels in ``NUMBA_CACHE_DIR``, else next
to the sources (``__pycache__``), else in ``~/.cache/numba``, and refuses to import a cached function
when none of these can be written (an installed package run by a user whose ``HOME`` is not writable:
a service account, ``HOME=/nonexistent``). Before any kernel module is imported, :func:`_cache_fallback`
checks those places the way Numba does and, when none is writable, points ``NUMBA_CACHE_DIR`` at
``herdscope/numba`` under the user's cache directory or, failing that, at a private directory in the
temporary directory; caching goes on there. ``CACHE_NOTICE`` then holds the one line the command line
prints about it (on the run that creates that directory, or on every run while a ``NUMBA_CACHE_DIR``
that was set cannot be written). If no directory at all can be written, caching is turned off
(kernels compile on every run).
"""
import os
import stat
import sys
import tempfile

__version__ = "0.1.0"
__all__ = ["Capture", "open_capture", "open_captures", "HerdscopeError", "UnreadableCapture", "__version__"]

from .errors import HerdscopeError, UnreadableCapture  # noqa: E402 (light: no kernels)

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# Directories whose modules hold @njit(cache=True) kernels (detectors/ is installed next to analyzer/).
_KERNEL_DIRS = [os.path.join(_PACKAGE_DIR, d) for d in ("", "kernels", "tcp", "decoders")]
_KERNEL_DIRS.append(os.path.join(os.path.dirname(_PACKAGE_DIR), "detectors"))
CACHE_NOTICE = ""  # one line for the user when the Numba cache had to move (or be turned off)
CACHE_KEPT = True  # whether kernels compiled by this process are there for the next (not for this run only, not off)


def _writable(path: str) -> bool:
    """Numba's own test (caching.ensure_cache_path): the directory can be made and written into."""
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
        return True
    except OSError:
        return False


def _private_dir(path: str) -> bool:
    """``path`` is (or now is) a directory of ours that nobody else can write: cached kernels are
    code that will be loaded, so a directory in a shared place must not be another user's."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and _writable(path))


def _user_cache_home() -> str:
    return os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")


def _cache_fallback() -> str:
    """Make sure Numba can cache the kernels (see the module docstring); returns the notice ("" if
    nothing had to change)."""
    given = os.environ.get("NUMBA_CACHE_DIR")
    if given and _writable(given):
        return ""
    # Numba's next places (it moves on to them by itself when NUMBA_CACHE_DIR cannot be written).
    if all(_writable(os.path.join(d, "__pycache__")) for d in _KERNEL_DIRS if os.path.isdir(d)):
        return ""
    if _writable(os.path.join(_user_cache_home(), "numba")):
        return ""
    why = f"NUMBA_CACHE_DIR={given} is not writable" if given else "no writable Numba cache directory"
    places = [os.path.join(_user_cache_home(), "herdscope", "numba"),
              os.path.join(tempfile.gettempdir(), f"herdscope-numba-{os.geteuid()}")]
    for place in places:
        existed = os.path.isdir(place)
        if _private_dir(place):
            _set_cache_dir(place)
            # said once, on the run that creates it (and compiles), unless the user's setting is wrong
            return f"{why}; caching compiled kernels in {place}" if given or not existed else ""
    global CACHE_KEPT
    CACHE_KEPT = False
    try:
        place = tempfile.mkdtemp(prefix="herdscope-numba-")
    except OSError:
        _disable_caching()
        return f"{why} and no temporary directory either; kernels are compiled on every run"
    _set_cache_dir(place)
    return f"{why}; caching compiled kernels in {place} for this run only"


def _set_cache_dir(path: str) -> None:
    os.environ["NUMBA_CACHE_DIR"] = path
    config = sys.modules.get("numba.core.config")
    if config is not None:  # numba was imported first: its config already read the environment
        config.CACHE_DIR = path


def _disable_caching() -> None:
    from numba.core.dispatcher import Dispatcher  # lazy: Numba only when its cache cannot be written

    Dispatcher.enable_caching = lambda self: None


CACHE_NOTICE = _cache_fallback()


def __getattr__(name: str):
    if name in ("Capture", "open_capture", "open_captures"):
        from . import capture  # lazy: PEP 562; the reader loads Polars and Numba on first use

        return getattr(capture, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
