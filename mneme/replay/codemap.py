"""Device function addresses in a replay: the app's, as the recording holds them, and the replay module's.

The recorded words at a code table's function offsets (mneme.ir.codeaddr: `__device__ fn_t d_table[] =
{twice, plusOne};`, vtables) are the app's addresses of those functions; the same words of the replay module,
read right after it loaded and before the recorded variables overwrite them, are its own. Each pair is one
entry of the module's code map: the replay core writes the module's address wherever a variable word holds the
app's (mnc_module_set_code_map), and `relocate_args` does the same for the parameters the kernel calls
(a pointer the host read with cudaMemcpyFromSymbol and passed back).

The recorded words are the tables' contents at the launch: a table the app rewrote before it can pair one
function with two addresses, or two functions with one; such pairs are dropped and named (`conflicts`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from mneme.errors import RecordError

CodeWords = List[Tuple[int, str]]


@dataclass
class CodeMap:
    #: the app's address of a device function -> the replay module's
    pairs: Dict[int, int] = field(default_factory=dict)
    #: the app's address -> the function's (mangled) name
    names: Dict[int, str] = field(default_factory=dict)
    #: functions whose pairs disagreed between tables (dropped)
    conflicts: List[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.pairs)


def _word(data, off: int) -> Optional[int]:
    if off < 0 or off + 8 > len(data):
        return None
    return struct.unpack_from("<Q", bytes(data[off:off + 8]))[0]


def build(tables: Mapping[str, CodeWords], recorded: Mapping[str, bytes],
          fresh: Callable[[str], Optional[bytes]]) -> CodeMap:
    """The code map of one loaded module: `tables` from its IR, `recorded` the prologue's variable contents by
    name, `fresh(name)` the module's own contents of a variable before anything was written (None: it lacks it)."""
    seen: List[Tuple[str, int, int]] = []  # (function, app address, module address) of every table word
    for name, words in sorted(tables.items()):
        if name not in recorded:
            continue
        mine = fresh(name)
        if mine is None:
            continue
        for off, fn in words:
            app, here = _word(recorded[name], off), _word(mine, off)
            if app and here:
                seen.append((fn, app, here))
    by_fn: Dict[str, set] = {}
    by_app: Dict[int, set] = {}
    for fn, app, here in seen:
        by_fn.setdefault(fn, set()).add((app, here))
        by_app.setdefault(app, set()).add((fn, here))
    # a function seen at two addresses, or an address that names two functions: the app rewrote a table
    bad = {fn for fn, v in by_fn.items() if len(v) > 1}
    bad |= {fn for v in by_app.values() if len(v) > 1 for fn, _ in v}
    tainted = {app for fn in bad for app, _ in by_fn[fn]}
    cmap = CodeMap(conflicts=sorted(bad))
    for fn, app, here in seen:
        if fn not in bad and app not in tainted:
            cmap.pairs[app], cmap.names[app] = here, fn
    return cmap


def relocate_args(raw: bytes, offsets: Sequence[int], sizes: Sequence[int], params: Sequence[int],
                  arg_names: Sequence[str], cmap: CodeMap, where: str = "") -> bytes:
    """The argument buffer with each function-pointer parameter's app address replaced by the module's; an
    address no code table names is an error that says where the app's pointer came from."""
    out = bytearray(raw)
    for i in params:
        if i >= len(offsets) or sizes[i] != 8:
            continue
        (value,) = struct.unpack_from("<Q", out, offsets[i])
        if value == 0:
            continue
        name = arg_names[i] if i < len(arg_names) else f"#{i}"
        if value not in cmap.pairs:
            known = ", ".join(sorted(set(cmap.names.values()))[:6]) or "none"
            raise RecordError(
                f"{where}argument {i} ({name}) holds 0x{value:x}, which is the app's address of none of the device "
                f"functions its module's variables name ({known}): replay can relocate a function pointer the app "
                "read from a __device__ variable (cudaMemcpyFromSymbol of `__device__ fn_t p = f;`) or a table, not "
                "one a kernel computed or stored elsewhere")
        struct.pack_into("<Q", out, offsets[i], cmap.pairs[value])
    return bytes(out)


def attach(mod, tables: Mapping[str, CodeWords], prologue, args, params: Sequence[int], arg_names: Sequence[str],
           where: str = "") -> CodeMap:
    """Before the recorded variables overwrite them: `mod`'s own function addresses in its code tables, paired
    with the app's that `prologue` holds, become the module's code map (mneme.device.DeviceModule.set_code_map);
    with function-pointer `params`, `mod.replay_args` are `args` relocated (ReplayPipeline.args_for)."""
    from mneme.device import KernelArgs

    cmap = build(tables, {v.name: v.contents for v in prologue.variables}, mod.read_global)
    if cmap:
        mod.set_code_map(cmap.pairs)
    if params:
        raw = relocate_args(bytes(args.raw), args.offsets, args.sizes, params, arg_names, cmap, where)
        mod.replay_args = KernelArgs(raw, args.offsets, args.sizes)
    return cmap
