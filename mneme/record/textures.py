"""Texture and surface objects of a recorded instance: what the record DB says about them, and whether
replay can recreate them.

The recorder writes every live object an argument word names into the prologue (mn_texobj records, the
CUDA arrays behind them as mn_array records, again in the epilogue after the launch). The kernel's IR
says which parameters really are handles (mneme.ir.textures). Decided here:
  - a texture operation whose handle the kernel loads from memory is not replayable (named, not guessed);
  - every handle parameter must hold a captured object, and linear/pitched resources must lie in
    recorded memory (a blob), since replay gives them their recorded device addresses;
  - the DB entry of each object (schema.TextureArg); `Written` marks surfaces the kernel stores to,
    whose arrays are verified after a replay.
"""

from __future__ import annotations

import struct
from typing import Any, Dict, List, Optional, Sequence, Tuple

from mneme.errors import MnemeError, SnapshotError
from mneme.snapshot import ARRAY_FORMATS, Snapshot


def memory_reasons(uses: Any) -> List[str]:
    """Reasons (one each) why handles read from memory make the kernel not replayable."""
    if uses is None or not uses.from_memory:
        return []
    return [f"the kernel's texture/surface operations take handles it reads from memory, not from its arguments "
            f"({'; '.join(uses.from_memory)}); replay recreates only objects passed as arguments"]


def _extent(o: Dict[str, Any]) -> int:
    if o["res_type"] == 2:  # linear
        return int(o["size_bytes"])
    return int(o["pitch"]) * max(int(o["height"]), 1)


def describe(obj: Any, param: int, offset: int, array: Any = None, written: bool = False) -> Dict[str, Any]:
    """The DB entry (schema.TextureArg) of one object; `array` is its Array record when it has one."""
    f = obj.fields
    if array is not None:
        dims = [array.width, array.height, array.depth]
        fmt, channels = array.format, array.channels
    elif obj.resource == "pitch2d":
        dims, fmt, channels = [int(f["width"]), int(f["height"]), 0], int(f["format"]), int(f["channels"])
    else:
        dims, fmt, channels = [int(f["size_bytes"]), 0, 0], int(f["format"]), int(f["channels"])
    return {
        "Param": param, "Offset": offset, "Handle": f"0x{obj.handle:x}",
        "Kind": "surface" if obj.surface else "texture", "Resource": obj.resource,
        "Format": ARRAY_FORMATS.get(fmt, f"0x{fmt:x}"), "Channels": channels, "Dims": dims,
        "Levels": array.levels if array is not None else 0, "Flags": array.flags if array is not None else 0,
        "Bytes": len(array.contents) if array is not None else 0, "Written": bool(written),
    }


def instance_textures(uses: Any, prologue: Any, epilogue: Any, params: Sequence[Sequence[int]], args: bytes,
                      arg_names: Sequence[str], capture_error: str = "") -> Tuple[List[Dict[str, Any]], List[str]]:
    """(DB entries, reasons it is not replayable) for one instance whose kernel has texture params.

    `prologue`/`epilogue` are the instance's snapshot paths (or open Snapshots); `params` the recorded
    (offset, size) of each parameter, `args` the argument bytes."""
    if uses is None or not uses.params:
        return [], []
    if capture_error:
        return [], [f"its texture/surface objects could not be recorded: {capture_error}"]
    try:
        pro = prologue if isinstance(prologue, Snapshot) else Snapshot.read(prologue)
        epi = epilogue if isinstance(epilogue, Snapshot) or epilogue is None else Snapshot.read(epilogue)
    except SnapshotError as e:
        return [], [f"its texture/surface objects cannot be read from its snapshots: {e}"]
    try:
        objs = {o.handle: o for o in pro.texobjs}
        after = {a.handle for a in epi.arrays} if epi is not None else None
        entries, reasons = [], []
        for i, fields in ((i, uses.offsets.get(i, (0,))) for i in uses.params):
            for field_off in fields:
                entry, why = _one(pro, objs, after, params, args, arg_names, i, field_off, i in uses.writes)
                if entry is not None:
                    entries.append(entry)
                elif why not in reasons:
                    reasons.append(why)
        return entries, reasons
    finally:
        if pro is not prologue:
            pro.close()
        if epi is not None and epi is not epilogue:
            epi.close()


def _one(pro: Any, objs: Dict[int, Any], after: Optional[set], params: Sequence[Sequence[int]], args: bytes,
         arg_names: Sequence[str], i: int, field_off: int, written: bool) -> Tuple[Optional[Dict[str, Any]], str]:
    """(DB entry, "") of the handle at `field_off` of parameter i, or (None, why replay cannot recreate it)."""
    name = arg_names[i] if i < len(arg_names) else f"arg{i}"
    if field_off:
        name += f" at byte {field_off}"
    if i >= len(params) or int(params[i][1]) < field_off + 8:
        return None, f"argument {i} ({name}) is used as a texture/surface handle but holds no 8 bytes there"
    off = int(params[i][0]) + field_off
    (handle,) = struct.unpack_from("<Q", args, off)
    obj = objs.get(handle)
    if obj is None:
        return None, (f"argument {i} ({name}) holds 0x{handle:x}, which was no live texture or surface object at "
                      "the launch (created before recording started, or already destroyed)")
    array = pro.find_array(obj.fields["array"]) if obj.resource in ("array", "mipmapped") else None
    if obj.resource in ("array", "mipmapped") and array is None:
        return None, f"argument {i} ({name}): the array behind object 0x{handle:x} is not in the prologue"
    if array is not None and after is not None and array.handle not in after:
        return None, f"argument {i} ({name}): the epilogue lacks the contents of array 0x{array.handle:x}"
    if array is None:
        ptr, n = int(obj.fields["dev_ptr"]), _extent(obj.fields)
        blob = pro.find_blob(ptr)
        if blob is None or ptr + n > blob.addr + blob.size:
            return None, (f"argument {i} ({name}): object 0x{handle:x} reads {n} B at 0x{ptr:x}, outside the memory "
                          "mneme records (cudaMalloc'd memory of the arena)")
    return describe(obj, i, off, array, written=written), ""


def replay_args(raw: bytes, textures: Sequence[Dict[str, Any]], handle_of) -> bytes:
    """The argument bytes with each recorded handle replaced by `handle_of(recorded)` (replay's object)."""
    out = bytearray(raw)
    for t in textures:
        off = int(t["Offset"])
        (recorded,) = struct.unpack_from("<Q", out, off)
        if recorded != int(t["Handle"], 16):
            raise MnemeError(f"argument {t['Param']}: the prologue holds 0x{recorded:x} at offset {off}, the record DB "
                             f"says {t['Handle']}: the DB and its snapshots disagree; record again")
        struct.pack_into("<Q", out, off, int(handle_of(recorded)))
    return bytes(out)


def texture_summary(textures: Sequence[Dict[str, Any]]) -> Optional[str]:
    """One line for `mneme show`: "2 textures (array 512x512 f32, linear f32), 1 surface (array ...)"."""
    if not textures:
        return None
    parts = []
    for t in textures:
        dims = "x".join(str(d) for d in t["Dims"] if d) or "?"
        parts.append(f"arg {t['Param']}: {t['Kind']} over {t['Resource']} {dims} {t['Format']}x{t['Channels']}"
                     + (f", {t['Levels']} levels" if t.get("Levels") else "") + (" (written)" if t.get("Written") else ""))
    return "; ".join(parts)
