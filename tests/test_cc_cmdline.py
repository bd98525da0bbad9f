"""How `mneme cc` reads a compiler command line (no compiler runs here)."""

import pytest

from mneme.cc.cmdline import default_object, parse
from mneme.errors import ConfigurationError


def test_compile_only_with_output():
    inv = parse(["-O2", "-Iinc", "-DN=4", "-c", "k.cu", "-o", "out/k.o"])
    assert inv.mode == "compile"
    assert [(s.path, s.lang) for s in inv.sources] == [("k.cu", "cuda")]
    assert inv.output == "out/k.o"
    assert inv.ir_flags() == ["-Iinc", "-DN=4"]  # -O2 is not repeated for the device bitcode


def test_languages_by_extension_and_forced_x():
    inv = parse(["a.cu", "b.cpp", "c.c", "d.S", "-x", "cuda", "e.inc", "-x", "none", "f.cc", "lib.a", "g.o"])
    assert [(s.path, s.lang) for s in inv.sources] == [
        ("a.cu", "cuda"), ("b.cpp", "c++"), ("c.c", "c"), ("d.S", "asm"), ("e.inc", "cuda"), ("f.cc", "c++"),
    ]
    assert [g for k, g in inv.items if k == "object"] == [["lib.a"], ["g.o"]]
    assert inv.mode == "link"
    assert "-x" not in inv.flags()  # consumed: it must not reach a link line full of objects


@pytest.mark.parametrize(
    "args, archs",
    [
        (["--cuda-gpu-arch=sm_80"], ["sm_80"]),
        (["-arch=sm_86"], ["sm_86"]),
        (["-arch", "sm_89"], ["sm_89"]),
        (["--arch", "sm_90a"], ["sm_90a"]),
        (["--offload-arch=sm_80,sm_90"], ["sm_80", "sm_90"]),
        (["--gpu-architecture=compute_90"], ["sm_90"]),
        ([], []),
    ],
)
def test_gpu_architecture_flags(args, archs):
    inv = parse(args + ["-c", "k.cu"])
    assert inv.archs == archs
    assert not any("arch" in a for a in inv.flags())  # replaced by the wrapper's --cuda-gpu-arch


def test_bad_architecture_names_the_flag():
    with pytest.raises(ConfigurationError, match=r"-arch=x86.*sm_NN"):
        parse(["-arch=x86", "-c", "k.cu"])


def test_separate_value_flags_are_not_inputs():
    inv = parse(["-I", "inc.cu", "-include", "pre.h", "-MF", "dep.cu", "-Xlinker", "x.cu", "-c", "k.cu"])
    assert [s.path for s in inv.sources] == ["k.cu"]
    assert inv.ir_flags() == ["-I", "inc.cu", "-include", "pre.h"]


def test_dependency_flags_are_kept_apart():
    inv = parse(["-MD", "-MT", "k.o", "-MF", "k.d", "-MP", "-c", "k.cu"])
    assert inv.mode == "compile" and inv.wants_deps
    assert [g for k, g in inv.items if k == "dep"] == [["-MD"], ["-MT", "k.o"], ["-MF", "k.d"], ["-MP"]]
    assert inv.ir_flags() == []


@pytest.mark.parametrize(
    "args, mode",
    [
        (["--version"], "info"),
        (["-E", "k.cu"], "preprocess"),
        (["-M", "k.cu"], "preprocess"),
        (["-MM", "-MD", "-c", "k.cu"], "compile"),
        (["-fsyntax-only", "k.cu"], "preprocess"),
        (["-S", "k.cu"], "asm"),
        (["--cuda-device-only", "-c", "k.cu"], "asm"),
        (["-c", "k.cu"], "compile"),
        (["k.o", "-o", "app"], "link"),
        (["-shared", "k.o", "-o", "libk.so"], "link"),
        (["-r", "a.o", "b.o", "-o", "ab.o"], "relocatable"),
    ],
)
def test_modes(args, mode):
    assert parse(args).mode == mode


def test_device_code_flags_reach_the_bitcode_compile():
    inv = parse(["-std=c++17", "-fgpu-rdc", "-ffast-math", "-fcuda-flush-denormals-to-zero", "-Wall", "-g",
                 "-fPIC", "-march=native", "-isystem", "sys", "-Xarch_device", "-DDEV", "-c", "k.cu"])
    assert inv.ir_flags() == ["-std=c++17", "-fgpu-rdc", "-ffast-math", "-fcuda-flush-denormals-to-zero",
                              "-isystem", "sys", "-Xarch_device", "-DDEV"]
    assert inv.is_rdc
    assert not parse(["-fgpu-rdc", "-fno-gpu-rdc", "-c", "k.cu"]).is_rdc


def test_cuda_path_and_verbose():
    inv = parse(["--cuda-path=/opt/cuda", "-v", "-c", "k.cu"])
    assert inv.cuda_path == "/opt/cuda" and inv.verbose
    assert "--cuda-path=/opt/cuda" not in inv.flags()


def test_response_files_are_expanded(tmp_path):
    rsp = tmp_path / "args.rsp"
    rsp.write_text('-I"dir with space" -DX=1\n')
    inv = parse([f"@{rsp}", "-c", "k.cu"])
    assert inv.ir_flags() == ["-Idir with space", "-DX=1"]


def test_one_output_for_many_sources_is_refused():
    with pytest.raises(ConfigurationError, match="-o k.o with -c and 2 sources"):
        parse(["-c", "a.cu", "b.cu", "-o", "k.o"])


def test_missing_flag_value():
    with pytest.raises(ConfigurationError, match="'-o'"):
        parse(["-c", "k.cu", "-o"])


def test_default_object_is_in_the_current_directory():
    assert default_object("src/dir/k.cu") == "k.o"
