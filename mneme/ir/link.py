"""Link recorded modules, prune them to one kernel's closure, internalize its helpers.

Variables are never internalized. The replay core finds every `__device__`/`__constant__` variable
by name (cuModuleGetGlobal) to load its recorded contents, so the variables a kernel uses must keep
their names and stay visible globals in the PTX. External linkage also stops the optimizer from
folding a variable's compile-time initializer into the code, which would be wrong: at replay the
variable holds the recorded value, not the initializer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union

import llvmlite.binding as llvm

from mneme.errors import CompileError
from mneme.ir.codeaddr import closure_roots
from mneme.ir.module import kernel_function, module_kernels, new_context, parse_module
from mneme.ir.target import pass_builder, target_machine

ModuleSource = Union[str, Path, bytes, llvm.ModuleRef]

_LOCAL = (llvm.Linkage.internal, llvm.Linkage.private)
#: Lists that keep their members alive whatever uses them; clang lists every host-visible variable there.
_USED_LISTS = ("llvm.used", "llvm.compiler.used")


def _global_values(mod: llvm.ModuleRef):
    yield from mod.functions
    yield from mod.global_variables


def _lookup(mod: llvm.ModuleRef, name: str) -> Optional[llvm.ValueRef]:
    for get in (mod.get_function, mod.get_global_variable):
        try:
            return get(name)
        except NameError:
            pass
    return None


def _drop_used_lists(mod: llvm.ModuleRef) -> None:
    # llvmlite cannot delete a global; renamed and internal, the list is an ordinary dead variable.
    for name in _USED_LISTS:
        gv = _lookup(mod, name)
        if gv is not None:
            gv.name = f"__mneme_dropped.{name}"
            gv.linkage = llvm.Linkage.internal


def _globaldce(mod: llvm.ModuleRef) -> None:
    pm = llvm.create_new_module_pass_manager()
    pm.add_global_dead_code_eliminate_pass()
    pm.run(mod, pass_builder(target_machine()))


def prune(mod: llvm.ModuleRef, roots: Iterable[str]) -> llvm.ModuleRef:
    """Delete everything `roots` do not reach, transitively (functions, variables, declarations).

    Mutates `mod` and returns it. Linkage is untouched for what survives: symbols are made internal
    only for the duration of a global DCE, which then decides reachability in C++.
    """
    keep = set(roots)
    _drop_used_lists(mod)
    saved: Dict[str, Tuple[llvm.Linkage, llvm.Visibility]] = {}
    for gv in _global_values(mod):
        if gv.is_declaration or gv.name in keep or gv.linkage in _LOCAL:
            continue
        saved[gv.name] = (gv.linkage, gv.visibility)
        gv.visibility = llvm.Visibility.default
        gv.linkage = llvm.Linkage.internal
    _globaldce(mod)
    # by iteration: llvmlite's lookup by name does not see internal variables
    for gv in _global_values(mod):
        if gv.name in saved:
            gv.linkage, gv.visibility = saved[gv.name]
    return mod


def internalize(mod: llvm.ModuleRef, kernel_name: str) -> llvm.ModuleRef:
    """Give every function but the kernels internal linkage (variables stay external; see the module doc).

    The kernel itself becomes external: a linkonce/weak kernel nothing references would otherwise be
    deleted by the optimizer's global DCE. Other kernels left after pruning are the ones it launches
    from device code (dynamic parallelism): they stay kernels with their linkage, visible `.entry`s.
    """
    kernel = kernel_function(mod, kernel_name)
    if kernel.linkage != llvm.Linkage.external:
        kernel.linkage = llvm.Linkage.external
    kernels = set(module_kernels(mod))
    for fn in mod.functions:
        if fn.is_declaration or fn.name in kernels or fn.linkage in _LOCAL:
            continue
        fn.visibility = llvm.Visibility.default
        fn.linkage = llvm.Linkage.internal
    return mod


_internalize = internalize


def _exported(mod: llvm.ModuleRef) -> Set[str]:
    return {
        gv.name
        for gv in _global_values(mod)
        if not gv.is_declaration
        and gv.linkage not in _LOCAL
        and gv.linkage != llvm.Linkage.available_externally
    }


def undefined_symbols(mod: llvm.ModuleRef) -> List[str]:
    """Functions and variables the module declares but does not define (intrinsics and weak
    declarations, which may stay unresolved, excluded)."""
    return sorted(
        gv.name
        for gv in _global_values(mod)
        if gv.is_declaration and not gv.name.startswith("llvm.") and gv.linkage != llvm.Linkage.external_weak
    )


def _load(src: ModuleSource, name: str, ctx: llvm.ContextRef) -> llvm.ModuleRef:
    if isinstance(src, llvm.ModuleRef):
        src = src.as_bitcode()  # modules of other contexts cannot be linked; move it through bitcode
    return parse_module(src, name=name, context=ctx)


def _closure(sources: Sequence[Tuple[str, ModuleSource]], kernel_name: str, do_prune: bool):
    """Start from the module that defines the kernel; add modules that define what is still undefined."""
    if not sources:
        raise CompileError(f"no IR modules given for kernel {kernel_name!r}")
    ctx = new_context()
    mods = [(name, _load(src, name, ctx)) for name, src in sources]
    exported = [_exported(m) for _, m in mods]
    root = next((i for i, (_, m) in enumerate(mods) if kernel_name in exported[i]), None)
    if root is None:
        found = {name: module_kernels(m) for name, m in mods}
        raise CompileError(f"kernel {kernel_name!r} is defined in none of the modules; they define {found}")
    # a kernel that calls through pointers keeps its module's code tables (mneme.ir.codeaddr)
    roots = closure_roots(mods[root][1], kernel_name) if do_prune else [kernel_name]
    dst = mods[root][1].clone()
    if do_prune:
        prune(dst, roots)
    used = [mods[root][0]]
    while True:
        missing = set(undefined_symbols(dst))
        provider = next((i for i in range(len(mods)) if missing & exported[i]), None)
        if provider is None:
            break
        name, pristine = mods[provider]
        src = pristine.clone()
        if do_prune:
            prune(src, missing & exported[provider])
        try:
            dst.link_in(src)
        except RuntimeError as e:
            raise CompileError(f"linking {name} into the closure of {kernel_name!r}: {e}") from None
        if name not in used:
            used.append(name)
    if do_prune:
        prune(dst, roots)
    return dst, used


def _named(sources: Iterable[ModuleSource]) -> List[Tuple[str, ModuleSource]]:
    out = []
    for i, src in enumerate(sources):
        if isinstance(src, (str, Path)):
            out.append((str(src), src))
        elif isinstance(src, llvm.ModuleRef):
            out.append((src.name or f"<module {i}>", src))
        else:
            out.append((f"<bitcode {i}>", src))
    return out


def link_modules(
    paths_or_modules: Iterable[ModuleSource], kernel_name: str, prune: bool = True, internalize: bool = True
) -> llvm.ModuleRef:
    """One module holding the kernel and everything it needs from the recorded modules.

    Modules are added on demand (the kernel's own first, then those that define what is still
    undefined), so separately compiled translation units that reuse names never collide. The result
    lives in its own LLVM context; caller's ModuleRefs are read, never consumed.
    """
    mod, _ = _closure(_named(paths_or_modules), kernel_name, prune)
    if internalize:
        _internalize(mod, kernel_name)
    return mod


def extract_kernel_closure(
    modules: Sequence[Tuple[str, bytes]], kernel_name: str
) -> Tuple[llvm.ModuleRef, List[str]]:
    """The kernel's pruned closure across translation units, and the names of the modules it came from.

    Used at record time: with relocatable device code a kernel may call an `extern __device__`
    function of another unit; linkonce_odr copies (templates, inline functions) merge.
    """
    return _closure(list(modules), kernel_name, True)


@dataclass(frozen=True)
class GlobalVar:
    """A module-level variable as the replay core sees it (found by name, loaded with recorded bytes).

    addrspace 1 is `__device__` (global), 4 is `__constant__`, 3 is `__shared__`.
    """

    name: str
    addrspace: int
    size: int
    defined: bool


def module_globals(mod: llvm.ModuleRef) -> List[GlobalVar]:
    """The visible device variables of a (pruned) module: those the replay core loads by name.

    `__shared__` variables (addrspace 3) and internal ones (string literals, unexposed statics) are
    left out: they have no recorded contents to load.
    """
    td = llvm.create_target_data(mod.data_layout)
    out = []
    for gv in mod.global_variables:
        if gv.name.startswith("llvm.") or gv.linkage in _LOCAL:
            continue
        ty = str(gv.type)
        space = int(ty.split("addrspace(")[1].split(")")[0]) if "addrspace(" in ty else 0
        if space == 3:
            continue
        out.append(GlobalVar(gv.name, space, td.get_abi_size(gv.global_value_type), not gv.is_declaration))
    return out
