"""The two names of a recording: the static hash (which code) and the dynamic hash (which launch).

Static hash: the kernel's mangled name and the canonical IR of its pruned closure across translation
units (`mneme.ir.static_hash`), so editing a kernel the recorded one cannot reach changes nothing.
A kernel recorded without IR (the app was not built with `mneme cc`) is named by its mangled name alone.

Dynamic hash: the static hash, grid, block, dynamic shared memory and the *scalar* argument bytes. The
masked bytes - pointers, whose values differ from run to run, and struct padding, which holds garbage -
are left out. Mneme leaves arguments out entirely; mneme keeps scalars because specializing a kernel on
its argument values makes two launches with different scalars different replay targets. Cluster
dimensions and cooperative launch are part of the launch too, but only enter the hash when set, so
the ordinary launch's hash is exactly the rule above.

The recorder deduplicates instances in-process with the same fields and the same mask (it logs the
mask it used); this module is the one place that turns them into the hash the DB stores.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Iterable, Optional, Sequence, Tuple

from mneme.errors import RecordError

DYNAMIC_HASH_CHARS = 16
_DYNAMIC_TAG = b"mneme-dynamic-v1\0"
_NO_IR_TAG = b"mneme-static-noir-v1\0"

Range = Tuple[int, int]


def static_hash(mod, kernel_name: str) -> str:
    """Static hash of a kernel from its (linked) closure module."""
    from mneme.ir import static_hash as ir_static_hash

    return ir_static_hash(mod, kernel_name)


def static_hash_without_ir(kernel_name: str) -> str:
    """Static hash of a kernel recorded without IR: its mangled name only (tagged, so it never equals
    the hash of a kernel with IR)."""
    return hashlib.sha256(_NO_IR_TAG + kernel_name.encode()).hexdigest()


def masked_args(args: bytes, masked: Iterable[Range]) -> bytes:
    """`args` with the masked byte ranges set to zero (ranges are clipped to the buffer)."""
    out = bytearray(args)
    for off, length in masked:
        if off < 0 or length < 0:
            raise RecordError(f"bad masked range ({off}, {length})")
        end = min(len(out), off + length)
        if off < end:
            out[off:end] = bytes(end - off)
    return bytes(out)


def _dims(v: Sequence[int], what: str) -> Tuple[int, int, int]:
    t = tuple(int(x) for x in v)
    if len(t) != 3 or any(x < 0 or x > 0xFFFFFFFF for x in t):
        raise RecordError(f"{what} must be three unsigned 32-bit numbers, got {list(v)!r}")
    return t  # type: ignore[return-value]


def dynamic_hash(
    static: str,
    grid: Sequence[int],
    block: Sequence[int],
    shared_mem: int,
    args: bytes,
    masked: Iterable[Range] = (),
    cluster: Optional[Sequence[int]] = None,
    cooperative: bool = False,
) -> str:
    """The dynamic hash of one launch (hex, DYNAMIC_HASH_CHARS characters)."""
    h = hashlib.sha256(_DYNAMIC_TAG)
    h.update(static.encode() + b"\0")
    h.update(struct.pack("<3I3IQ", *_dims(grid, "grid"), *_dims(block, "block"), int(shared_mem)))
    if cluster is not None and any(int(c) for c in cluster):
        h.update(b"cluster" + struct.pack("<3I", *_dims(cluster, "cluster")))
    if cooperative:
        h.update(b"cooperative")
    scalars = masked_args(args, masked)
    h.update(struct.pack("<Q", len(scalars)))
    h.update(scalars)
    return h.hexdigest()[:DYNAMIC_HASH_CHARS]


def merge_ranges(ranges: Iterable[Range]) -> Tuple[Range, ...]:
    """Sorted, non-overlapping, adjacent ranges joined."""
    out = []
    for off, length in sorted((int(o), int(n)) for o, n in ranges if int(n) > 0):
        if out and off <= out[-1][0] + out[-1][1]:
            last_off, last_len = out[-1]
            out[-1] = (last_off, max(last_len, off + length - last_off))
        else:
            out.append((off, length))
    return tuple(out)
