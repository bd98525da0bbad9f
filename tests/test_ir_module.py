"""Module helpers: private contexts that survive the cycle collector, symbol spelling, kernel lookup."""

import gc
import subprocess
import sys
import textwrap

import pytest

from mneme.errors import CompileError
from mneme.ir import kernel_function, parse_module
from mneme.ir.module import symbol_token, unquote_symbol


def test_modules_and_contexts_freed_together_by_the_cycle_collector():
    # Before private contexts deferred their disposal, this crashed the interpreter (the context
    # was disposed first, deleting its modules, then each ModuleRef disposed its module again).
    code = textwrap.dedent(
        """
        import gc
        import llvmlite.binding as llvm
        from mneme.ir import new_context
        class Node: pass
        for _ in range(100):
            n = Node(); n.me = n
            n.mod = llvm.parse_assembly("define void @f() { ret void }", context=new_context())
            n.copy = n.mod.clone()
            del n
        gc.collect()
        print("survived")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "survived"


def test_symbol_spelling_round_trips():
    for name in ("_Z6vecAddPKfS0_Pfi", "with space", 'q"uote', "ünï", "1starts_with_digit"):
        token = symbol_token(name)
        assert unquote_symbol(token) == name
    assert symbol_token("_Z3fooi") == "_Z3fooi"
    assert symbol_token("a b") == '"a b"'


def test_quoted_kernel_names_are_found():
    mod = parse_module(b'define ptx_kernel void @"odd name"() {\n  ret void\n}\n')
    assert kernel_function(mod, "odd name").name == "odd name"
    with pytest.raises(CompileError, match=r"'other' is not defined.*\['odd name'\]"):
        kernel_function(mod, "other")
    gc.collect()
