"""Numba kernels: small ``@njit(cache=True)`` functions over NumPy arrays, called by thin Python
drivers that validate inputs first (the stumpy ``stump()`` → ``_stump()`` pattern).

Numba does not bounds-check: every kernel checks each length it reads against the end of the buffer
or record before it touches the bytes.
"""
