"""Reading integers from a uint8 buffer in either byte order. Callers check bounds first.

Every reader returns int64: Numba turns arithmetic that mixes signed and unsigned 64-bit integers
into float64, which silently loses nanoseconds.
"""
import numpy as np

from ..jit import lazy_global, njit


@njit(cache=True, inline="always")
def u16be(buf, off):
    return (np.int64(buf[off]) << 8) | np.int64(buf[off + 1])


@njit(cache=True, inline="always")
def u16le(buf, off):
    return np.int64(buf[off]) | (np.int64(buf[off + 1]) << 8)


@njit(cache=True, inline="always")
def u32be(buf, off):
    return ((np.int64(buf[off]) << 24) | (np.int64(buf[off + 1]) << 16)
            | (np.int64(buf[off + 2]) << 8) | np.int64(buf[off + 3]))


@njit(cache=True, inline="always")
def u32le(buf, off):
    return (np.int64(buf[off]) | (np.int64(buf[off + 1]) << 8)
            | (np.int64(buf[off + 2]) << 16) | (np.int64(buf[off + 3]) << 24))


@njit(cache=True, inline="always")
def u16(buf, off, big_endian):
    return u16be(buf, off) if big_endian else u16le(buf, off)


@njit(cache=True, inline="always")
def u32(buf, off, big_endian):
    return u32be(buf, off) if big_endian else u32le(buf, off)


@njit(cache=True, inline="always")
def u64(buf, off, big_endian):
    """As int64 (two's complement for values ≥ 2**63, which no timestamp reaches)."""
    if big_endian:
        return (u32be(buf, off) << 32) | u32be(buf, off + 4)
    return (u32le(buf, off + 4) << 32) | u32le(buf, off)


@njit(cache=True, inline="always")
def next_tcp_option(buf, p, end):
    """The TCP option at ``p`` (RFC 9293 §3.1): (kind, length, next position); kind -1 when the
    options end (EOL, or a malformed length that would run past ``end``). NOP has length 1."""
    if p >= end:
        return -1, 0, end
    kind = np.int64(buf[p])
    if kind == 0:
        return -1, 0, end
    if kind == 1:
        return 1, 1, p + 1
    if p + 1 >= end:
        return -1, 0, end
    olen = np.int64(buf[p + 1])
    if olen < 2 or p + olen > end:
        return -1, 0, end
    return kind, olen, p + olen


def _make_prefetch_address():
    """The intrinsic ``_prefetch_address(buf, pos)``: LLVM's prefetch (read, keep in all cache levels)
    of the byte ``buf[pos]``; callers clamp ``pos``. Made once Numba is imported (``jit.lazy_global``:
    an intrinsic needs Numba's and llvmlite's classes, which a command calling no kernel never imports)."""
    from llvmlite import ir  # lazy: made once Numba is imported (jit.lazy_global)
    from numba import types  # lazy: as above
    from numba.core import cgutils  # lazy: as above
    from numba.extending import intrinsic  # lazy: as above

    @intrinsic
    def _prefetch_address(typingctx, buf, pos):
        def codegen(context, builder, signature, args):
            array = context.make_array(signature.args[0])(context, builder, args[0])
            byte_ptr = ir.IntType(8).as_pointer()
            address = builder.bitcast(builder.gep(array.data, [args[1]]), byte_ptr)
            i32 = ir.IntType(32)
            fn = cgutils.get_or_insert_function(builder.module,
                                                ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32]),
                                                "llvm.prefetch.p0i8")
            builder.call(fn, [address, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
            return context.get_dummy_value()
        return types.void(buf, pos), codegen
    return _prefetch_address


lazy_global(globals(), "_prefetch_address", _make_prefetch_address)


CACHE_LINE = 64


@njit(cache=True, inline="always")
def prefetch_until(buf, ahead, target):
    """Ask the CPU to load the cache lines from ``ahead`` up to ``target`` (clamped to ``buf``); returns
    the new ``ahead``. A walker that follows records through the file (each length says where the next
    record starts) otherwise waits on a memory read per record; prefetching a few KB ahead of it turns
    the chain of cache misses into a stream (1M records: 120 -> 30 ms)."""
    last = min(target, buf.shape[0] - 1)
    while ahead <= last:
        _prefetch_address(buf, ahead)
        ahead += CACHE_LINE
    return ahead
