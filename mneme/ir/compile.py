"""One replay configuration -> one compiled kernel, each distinct code compiled once.

compile_kernel is the IR half of an experiment: specialize (args, dims, launch bounds; one
print/parse round trip, or a plain clone when there is nothing to write), optimize, PTX, cubin.
The code hash is known before any work, so a cache hit costs a dictionary lookup (or one file read
with a directory cache shared by processes, e.g. the tuner's compile pool).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import struct
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import llvmlite.binding as llvm

from mneme.config import ExperimentConfiguration
from mneme.errors import ConfigurationError
from mneme.ir.codegen import (
    CubinResult, assembler, assembler_version, binary_digest, emit_ptx, link_cubin, nvjitlink_options,
    ptx_instruction_count,
)
from mneme.ir.hashing import code_hash as make_code_hash
from mneme.ir.hashing import static_hash as make_static_hash
from mneme.ir.knobs import ASSEMBLER_ONLY, CodeKnobs
from mneme.ir.module import kernel_function
from mneme.ir.params import ParamInfo, kernel_params
from mneme.ir.pipeline import optimize, parse_pipeline
from mneme.ir.specialize import Specialization, make_specialization, reparse, rewrite_ir
from mneme.ir.target import DEFAULT_PTX, function_target


@dataclass
class CompiledKernel:
    """The result of compiling one code variant; plain data, so it pickles across processes.

    Times are those of the compile that produced it; `cache_hit` says this copy came from a cache.
    """

    code_hash: str
    kernel_name: str
    arch: str
    ptx: str
    cubin: CubinResult
    ll: Optional[str] = None
    specialization: Dict[str, Any] = field(default_factory=dict)
    preprocess_ir_time: float = 0.0
    opt_time: float = 0.0
    ptx_time: float = 0.0
    cubin_time: float = 0.0
    cache_hit: bool = False
    #: the PTX -> cubin tool (codegen.ASSEMBLERS)
    assembler: str = ""
    #: codegen.binary_digest of the cubin: equal for equal machine code, whatever produced it
    binary: str = ""
    #: instructions in the PTX (codegen.ptx_instruction_count)
    ptx_instructions: int = 0
    #: the PTX equalled that of an earlier compile (same assembler options): its cubin was reused, ptxas skipped
    cubin_reused: bool = False
    #: an earlier compile had the same IR-side inputs (ptx_source_key): its PTX was reused, LLVM skipped
    ptx_reused: bool = False

    @property
    def codegen_time(self) -> float:
        return self.ptx_time + self.cubin_time

    @property
    def obj_size(self) -> int:
        return self.cubin.size


_MAGIC = b"MNEMECK1"
#: key prefixes of CompileCache entries that are looked up by what one stage sees (ptx_key, ptx_source_key)
_SIDE_KEYS = ("ptx-", "src-")


def _toolchain_tag(using: Optional[str] = None) -> str:
    llvm_v = ".".join(map(str, llvm.llvm_version_info))
    return f"llvm{llvm_v}-{assembler_version(using or assembler())}"


@functools.lru_cache(maxsize=None)
def source_tag(root: Path = Path(__file__).resolve().parent) -> str:
    """The mneme code that turns IR into cubins (the modules of mneme/ir), by content: a cache directory is
    named after it, so a mneme whose code generation changed never serves another mneme's cubins for the same
    key (dims specialization once changed what a configuration compiles to, under the same key)."""
    h = hashlib.sha256()
    for f in sorted(root.glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def _encode(ck: CompiledKernel) -> bytes:
    meta = asdict(ck)
    blobs = [ck.ptx.encode(), ck.cubin.cubin, (ck.ll or "").encode()]
    meta.pop("ptx")
    meta.pop("ll")
    meta["cubin"].pop("cubin")
    meta["has_ll"] = ck.ll is not None
    meta["blob_sizes"] = [len(b) for b in blobs]
    head = json.dumps(meta).encode()
    return _MAGIC + struct.pack("<Q", len(head)) + head + b"".join(blobs)


def _decode(data: bytes) -> CompiledKernel:
    if data[:8] != _MAGIC:
        raise ValueError("not a mneme compile-cache entry")
    (n,) = struct.unpack("<Q", data[8:16])
    meta = json.loads(data[16 : 16 + n])
    pos = 16 + n
    blobs = []
    for size in meta.pop("blob_sizes"):
        blobs.append(data[pos : pos + size])
        pos += size
    if pos != len(data):
        raise ValueError("truncated compile-cache entry")
    has_ll = meta.pop("has_ll")
    cub = meta.pop("cubin")
    return CompiledKernel(
        ptx=blobs[0].decode(),
        cubin=CubinResult(cubin=blobs[1], **cub),
        ll=blobs[2].decode() if has_ll else None,
        **meta,
    )


class CompileCache:
    """Compiled kernels by code hash: in memory, and in `directory` when one is given.

    Directory entries are written to a temporary file and renamed into place, so concurrent
    processes never read half an entry; they live under a subdirectory named after the LLVM and
    assembler versions and mneme's own code generation (`source_tag`), so neither a toolchain change nor a
    mneme upgrade serves stale code. Unreadable entries are misses.
    """

    def __init__(self, directory: Union[str, Path, None] = None):
        self._mem: Dict[str, CompiledKernel] = {}
        self._lock = threading.Lock()
        self.directory = Path(directory) / f"{_toolchain_tag()}-ir{source_tag()}" if directory is not None else None
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        """Compiled variants held (by code hash; the entries under ptx_key and ptx_source_key are not counted)."""
        return sum(1 for k in self._mem if not k.startswith(_SIDE_KEYS))

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.mck"

    def get(self, key: str) -> Optional[CompiledKernel]:
        with self._lock:
            ck = self._mem.get(key)
        if ck is None and self.directory is not None:
            try:
                ck = _decode(self._path(key).read_bytes())
            except (OSError, ValueError, KeyError, TypeError):
                ck = None
            if ck is not None:
                with self._lock:
                    self._mem[key] = ck
        if key.startswith(_SIDE_KEYS):  # a cubin by its PTX, PTX by its IR inputs: not compile-cache lookups
            return ck
        with self._lock:
            if ck is None:
                self.misses += 1
                return None
            self.hits += 1
        return replace(ck, cache_hit=True)

    def put(self, ck: CompiledKernel, key: Optional[str] = None) -> None:
        """Store `ck` under `key` (default: its code hash)."""
        key = key or ck.code_hash
        with self._lock:
            self._mem[key] = replace(ck, cache_hit=False)
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{key[:16]}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(_encode(ck))
                os.replace(tmp, self._path(key))
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise

    def clear(self) -> None:
        with self._lock:
            self._mem.clear()


_DEFAULT_CACHE = CompileCache()


def default_cache() -> CompileCache:
    """The process-wide in-memory cache compile_kernel uses unless told otherwise."""
    return _DEFAULT_CACHE


_PRINTED: "Dict[int, tuple]" = {}


def _printed(mod: llvm.ModuleRef) -> str:
    """The module's IR text, printed once per module (compile_kernel never changes the linked module); the entry
    holds the module, so its id is not reused while cached."""
    hit = _PRINTED.get(id(mod))
    if hit is not None and hit[0] is mod:
        return hit[1]
    text = str(mod)
    if len(_PRINTED) >= 4:
        _PRINTED.pop(next(iter(_PRINTED)))
    _PRINTED[id(mod)] = (mod, text)
    return text


def config_specialization(
    mod: llvm.ModuleRef,
    kernel_name: str,
    config: ExperimentConfiguration,
    arg_values: Optional[Mapping[int, object]] = None,
    params: Optional[List[ParamInfo]] = None,
) -> Specialization:
    """What `config` asks to write into the kernel. Argument values for parameters that are not
    integer or floating scalars are ignored (they cannot become constants)."""
    args = {}
    if config.specialize and arg_values:
        params = params or kernel_params(mod, kernel_name)
        for idx, value in arg_values.items():
            i = int(idx)
            if 0 <= i < len(params) and params[i].specializable:
                args[i] = value
    return make_specialization(
        params,
        args,
        grid=tuple(config.grid) if config.specialize_dims else None,
        block=tuple(config.block) if config.specialize_dims else None,
        launch_bounds=(config.max_threads, config.min_blocks_per_sm) if config.set_launch_bounds else None,
    )


def compile_kernel(
    linked_mod: llvm.ModuleRef,
    kernel_name: str,
    config: ExperimentConfiguration,
    arch: str = "sm_90",
    static_hash: Optional[str] = None,
    arg_values: Optional[Mapping[int, object]] = None,
    cache: Union[CompileCache, None, bool] = None,
    keep_ll: bool = False,
    no_inline: Sequence[str] = (),
    reuse_ptx: bool = True,
) -> CompiledKernel:
    """Compile `config`'s variant of the kernel; `linked_mod` is cloned, never changed.

    `cache`: a CompileCache, None for the process-wide one, False for none. `keep_ll` keeps the
    optimized IR text (for --output-ll). `static_hash` is computed when not given (a few ms); a caller
    that passes it must have computed it from `linked_mod` (ReplayPipeline does, once per link), since
    the code hash - the cache key - is made of it with the specialization, pipeline, codegen options, arch
    and toolchain. `config.prune`/`internalize` were applied when `linked_mod` was linked. A module's LLVM
    context is single-threaded: compile one linked module from one thread at a time (the tuner's pool uses processes).
    `no_inline`: functions that stay calls when `config.cross_unit_inline` is off (other translation units').
    `reuse_ptx`: take the PTX of an earlier compile in `cache` whose IR-side inputs were the same (key_of_ir:
    the configurations differ only in assembler-only knobs, the method, or an unspecialized launch), skipping
    the optimizer and code generation; False compiles every configuration from the IR (bench_compile's old path).
    """
    problems = [p for p in config.problems() if not p.startswith(("grid", "block", "shared_mem"))]
    if problems:
        raise ConfigurationError(f"replay configuration cannot be compiled: {'; '.join(problems)}")
    t0 = time.perf_counter()
    fn = kernel_function(linked_mod, kernel_name)
    pipeline = parse_pipeline(config.passes)
    nvjitlink_options(arch, config.codegen_opt, config.codegen_method)
    params = kernel_params(linked_mod, kernel_name) if config.specialize and arg_values else None
    spec = config_specialization(linked_mod, kernel_name, config, arg_values, params)
    if static_hash is None:
        static_hash = make_static_hash(linked_mod, kernel_name)
    using = assembler()
    knobs = CodeKnobs.of(config)
    # the linked module was internalized or not (ReplayPipeline links both ways); the static hash does not see it
    hashed_knobs = {**knobs.describe(), **({} if config.internalize else {"internalize": False})}
    kept_calls = sorted(set(no_inline)) if not config.cross_unit_inline else []
    if kept_calls:
        hashed_knobs["no_inline"] = kept_calls
    key = make_code_hash(static_hash, spec, pipeline, config.codegen_opt, config.codegen_method, arch, using,
                         toolchain=_toolchain_tag(using), knobs=hashed_knobs)
    store = default_cache() if cache is None else (None if cache is False else cache)
    if store is not None:
        hit = store.get(key)
        if hit is not None and (hit.ll is not None or not keep_ll):
            return hit

    # configurations that differ only in what the assembler sees (ASSEMBLER_ONLY knobs, the method, the launch
    # where nothing is specialized) have the same PTX: the optimizer and code generation run once for them
    skey = ptx_source_key(key_of_ir(static_hash, spec, pipeline, config.codegen_opt, arch, hashed_knobs))
    source = store.get(skey) if store is not None and reuse_ptx else None
    if source is not None and (source.ll is not None or not keep_ll):
        ptx, ll = source.ptx, source.ll if keep_ll else None
        t1 = t2 = t3 = time.perf_counter()
    else:
        source = None
        ir_arch, ir_ptx = function_target(fn)
        retarget = arch if ir_arch and ir_arch != arch else None
        if spec or retarget or knobs.rewrites_ir:
            text = rewrite_ir(_printed(linked_mod), kernel_name, spec, fn, params, retarget)
            mod = reparse(knobs.rewrite(text), kernel_name)
        else:
            mod = linked_mod.clone()
        _keep_calls(mod, kept_calls)
        t1 = time.perf_counter()
        optimize(mod, pipeline, arch, config.codegen_opt, tuning=knobs)
        if knobs.rewrites_optimized:
            mod = reparse(knobs.rewrite_optimized(str(mod)), kernel_name)
        ll = str(mod) if keep_ll else None
        t2 = time.perf_counter()
        ptx = emit_ptx(mod, arch, config.codegen_opt, ir_ptx or DEFAULT_PTX)
        t3 = time.perf_counter()
    asm_opt, flags = knobs.assembler_opt(config.codegen_opt), knobs.ptxas_flags()
    pkey = ptx_key(ptx, arch, asm_opt, config.codegen_method, using, flags, kernel_name)
    earlier = store.get(pkey) if store is not None else None
    if earlier is not None:
        cubin = earlier.cubin
    else:
        cubin = link_cubin(ptx, arch, asm_opt, config.codegen_method, kernel=kernel_name, using=using, extra=flags)
    t4 = time.perf_counter()
    ck = CompiledKernel(
        code_hash=key,
        kernel_name=kernel_name,
        arch=arch,
        ptx=ptx,
        cubin=cubin,
        ll=ll,
        specialization=spec.describe(),
        preprocess_ir_time=t1 - t0,
        opt_time=t2 - t1,
        ptx_time=t3 - t2,
        cubin_time=t4 - t3,
        assembler="nvjitlink" if cubin.libraries else using,  # device-runtime code is linked (codegen.devrt_symbols)
        binary=binary_digest(cubin.cubin),
        ptx_instructions=ptx_instruction_count(ptx),
        cubin_reused=earlier is not None,
        ptx_reused=source is not None,
    )
    if store is not None:
        store.put(ck)
        if earlier is None:
            store.put(ck, key=pkey)
        if source is None:
            store.put(ck, key=skey)
    return ck


def _keep_calls(mod: llvm.ModuleRef, names: Sequence[str]) -> None:
    """`noinline` on each named function the module defines (not on alwaysinline ones, which must inline)."""
    for fn in mod.functions:
        if fn.name in names and not fn.is_declaration:
            attrs = " ".join(a.decode(errors="replace") for a in fn.attributes)
            if "alwaysinline" not in attrs.split():
                fn.add_function_attribute("noinline")


def key_of_ir(static_hash: str, spec: Specialization, pipeline, codegen_opt: int, arch: str,
              knobs: Mapping[str, Any]) -> Dict[str, Any]:
    """What the PTX of a compile depends on: the IR (static hash), what is written into it, the pipeline, the
    code generation level and target, LLVM's version, and the knobs but the assembler-only ones."""
    return {"static": static_hash, "spec": spec.describe(), "passes": pipeline.canonical, "codegen_opt": int(codegen_opt),
            "arch": arch, "llvm": list(llvm.llvm_version_info),
            "knobs": {k: v for k, v in knobs.items() if k not in ASSEMBLER_ONLY}}


def ptx_source_key(inputs: Mapping[str, Any]) -> str:
    """The cache key of PTX by the inputs key_of_ir lists."""
    import hashlib

    doc = json.dumps(dict(inputs), sort_keys=True, separators=(",", ":"))
    return "src-" + hashlib.sha256(b"mneme-ptx-source-v1\0" + doc.encode()).hexdigest()


def ptx_key(ptx: str, arch: str, opt: int, method: str, using: str, flags, kernel: str) -> str:
    """The cache key of a cubin by what the assembler sees: PTX text, target, level, method and flags."""
    import hashlib

    h = hashlib.sha256(b"mneme-ptx-v1\0")
    h.update(json.dumps([arch, int(opt), method, using, list(flags), kernel]).encode() + b"\0")
    h.update(ptx.encode())
    return "ptx-" + h.hexdigest()
