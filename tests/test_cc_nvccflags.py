"""nvcc's command line as mneme nvcc reads it (mneme.cc.nvccflags, mneme.cc.nvcctrans): option forms,
comma lists, options files, architectures in all their spellings, and errors that name the flag."""

import pytest

from mneme.cc.nvccflags import parse
from mneme.cc.nvcctrans import check_arch, resolve_archs
from mneme.errors import ConfigurationError


def archs(*argv):
    return resolve_archs(parse(list(argv) + ["k.cu"]).arch_values, 13)


def test_fast_math_spellings_are_the_same_option():
    for spelling in ("--use_fast_math", "-use_fast_math", "--use_fast_math"):
        cmd = parse([spelling, "-c", "k.cu"])
        assert cmd.fast_math and cmd.ftz_on and not cmd.prec_div_on and not cmd.prec_sqrt_on and cmd.fmad_on
        assert cmd.link == []  # not "-u se_fast_math"
    plain = parse(["-c", "k.cu"])
    assert not plain.ftz_on and plain.prec_div_on and plain.prec_sqrt_on
    # explicit settings win over --use_fast_math, in both orders
    assert parse(["--use_fast_math", "--ftz=false", "k.cu"]).ftz_on is False
    assert parse(["--prec-div", "true", "--use_fast_math", "k.cu"]).prec_div_on is True


def test_lineinfo_and_libraries():
    cmd = parse(["-lineinfo", "-lcuda", "-l", "m", "--library", "z,dl", "-L/opt/x", "k.cu"])
    assert cmd.lineinfo
    assert cmd.link == ["-lcuda", "-lm", "-lz", "-ldl", "-L/opt/x"]


def test_compiler_options_forms_and_comma_splitting():
    cmd = parse(["-Xcompiler", "-fPIC,-Wall", "-Xcompiler=-fopenmp", "--compiler-options", "-O3",
                 "--compiler-options=-march=native", "k.cu"])
    assert cmd.host == ["-fPIC", "-Wall", "-fopenmp", "-O3", "-march=native"]
    cmd = parse(["-Xptxas", "-v,-dlcm=ca", "--ptxas-options=-O2", "-Xlinker", "-rpath,/x", "-Xnvlink", "-w", "k.cu"])
    assert cmd.ptxas == ["-v", "-dlcm=ca", "-O2"]
    assert cmd.link == ["-Xlinker", "-rpath", "-Xlinker", "/x"]
    assert cmd.nvlink == ["-w"]


def test_valued_options_in_every_form():
    for argv in (["-maxrregcount=32"], ["-maxrregcount", "32"], ["--maxrregcount=32"]):
        assert parse(argv + ["k.cu"]).maxrregcount == 32
    for argv in (["-rdc=true"], ["-rdc", "true"], ["--relocatable-device-code=true"], ["-dc"]):
        assert parse(argv + ["k.cu"]).rdc
    assert not parse(["-rdc=false", "k.cu"]).rdc
    assert parse(["-std=c++17", "k.cu"]).std == "c++17"
    assert parse(["--std", "c++14", "k.cu"]).std == "c++14"
    assert parse(["-ccbin", "g++-12", "k.cu"]).ccbin == "g++-12"
    assert parse(["-ccbin=clang++", "k.cu"]).ccbin == "clang++"
    assert parse(["-cudart", "shared", "k.cu"]).cudart == "shared"
    assert parse(["--cudart=none", "k.cu"]).cudart == "none"
    assert parse(["k.cu"]).cudart == "static"  # nvcc's default
    assert parse(["-O3", "k.cu"]).opt == "3"
    assert parse(["-DA=1,B", "-D", "C", "-I", "x,y", "-Iz", "k.cu"]).pp == ["-DA=1", "-DB", "-DC", "-Ix", "-Iy", "-Iz"]


def test_phases_and_dependency_flags():
    assert parse(["-dc", "-c", "k.cu"]).phase == "dc"  # -c after -dc keeps the relocatable compile
    assert parse(["-dc", "-c", "k.cu"]).rdc
    assert parse(["-dlink", "a.o"]).phase == "dlink"
    assert parse(["-lib", "a.o"]).phase == "lib"
    assert parse(["-ptx", "k.cu"]).phase == "ptx"
    assert parse(["-M", "k.cu"]).phase == "M"
    cmd = parse(["-MD", "-MF", "k.d", "-MT", "k.o", "-c", "k.cu"])
    assert cmd.phase == "compile" and cmd.deps == ["-MD", "-MF", "k.d", "-MT", "k.o"]
    assert parse(["-x", "cu", "main.cpp"]).inputs[0].lang == "cuda"
    assert parse(["main.cpp", "a.o", "lib.a"]).inputs[1].lang == "obj"


def test_accepted_options_are_reported_not_dropped():
    cmd = parse(["--threads", "0", "-t", "4", "-Wno-deprecated-gpu-targets", "--expt-relaxed-constexpr",
                 "--extended-lambda", "--expt-extended-lambda", "-m64", "--diag-suppress", "177,550",
                 "-Xcudafe", "--diag_suppress=esa_on_defaulted_function_ignored", "-keep", "k.cu"])
    assert cmd.extended_lambda and cmd.relaxed_constexpr
    assert any("threads" in a for a in cmd.accepted) and any("diag_suppress" in a for a in cmd.accepted)


def test_unknown_and_unsupported_flags_are_errors_naming_them():
    with pytest.raises(ConfigurationError, match=r"-Wall"):
        parse(["-Wall", "k.cu"])
    assert parse(["-forward-unknown-to-host-compiler", "-Wall", "k.cu"]).host == ["-Wall"]
    with pytest.raises(ConfigurationError, match=r"-deviceemu"):
        parse(["-deviceemu", "k.cu"])
    with pytest.raises(ConfigurationError, match=r"-Xcudafe --foo"):
        parse(["-Xcudafe", "--foo", "k.cu"])
    with pytest.raises(ConfigurationError, match=r"--use_fast_math takes no value"):
        parse(["--use_fast_math=1", "k.cu"])
    with pytest.raises(ConfigurationError, match=r"-maxrregcount"):
        parse(["k.cu", "-maxrregcount"])


def test_options_files(tmp_path):
    (tmp_path / "inc.rsp").write_text('-I"/opt/with space" -DX=1\n--use_fast_math')
    (tmp_path / "more.rsp").write_text("-arch=sm_80")
    cmd = parse(["--options-file", str(tmp_path / "inc.rsp"), f"@{tmp_path / 'more.rsp'}", "k.cu"])
    assert cmd.pp == ["-I/opt/with space", "-DX=1"] and cmd.fast_math
    assert resolve_archs(cmd.arch_values, 13) == ["sm_80"]
    assert parse([f"-optf={tmp_path / 'inc.rsp'}", "k.cu"]).fast_math
    with pytest.raises(ConfigurationError, match="missing.rsp"):
        parse(["--options-file", str(tmp_path / "missing.rsp"), "k.cu"])


def test_architectures_in_all_spellings():
    assert archs("-arch=sm_90") == ["sm_90"]
    assert archs("-arch", "sm_90") == ["sm_90"]
    assert archs("--gpu-architecture=compute_80") == ["sm_80"]
    assert archs("-arch=compute_80", "-code=sm_80,sm_86") == ["sm_80", "sm_86"]
    assert archs("-gencode", "arch=compute_75,code=sm_75", "-gencode", "arch=compute_90,code=compute_90") == [
        "sm_75", "sm_90"]
    assert archs("--generate-code=arch=compute_90,code=[compute_90,sm_90]") == ["sm_90"]
    assert archs('-gencode=arch=compute_100,code="sm_100,compute_100"') == ["sm_100"]
    assert archs("-arch=sm_90a") == ["sm_90a"]
    nine = [f"--generate-code=arch=compute_{a},code=[compute_{a},sm_{a}]" for a in (75, 80, 86, 87, 89, 90, 100, 110, 120)]
    assert archs(*nine) == [f"sm_{a}" for a in (75, 80, 86, 87, 89, 90, 100, 110, 120)]
    every = archs("-arch=all")
    assert "sm_75" in every and "sm_120" in every and all(int(a[3:6].rstrip("af")) >= 75 for a in every)
    assert set(archs("-arch=all-major")) < set(every)
    assert archs() == ["sm_75"]  # nvcc 13's default


def test_old_architecture_is_one_line_naming_the_fix(monkeypatch):
    with pytest.raises(ConfigurationError) as e:
        archs("-arch=sm_60")
    msg = str(e.value)
    assert "\n" not in msg and "sm_60" in msg and "sm_75" in msg and "-arch=sm_90" in msg and "ARCH=sm_90" in msg
    with pytest.raises(ConfigurationError, match="sm_50"):
        archs("-gencode", "arch=compute_50,code=sm_50")
    check_arch("sm_75", 13)
    monkeypatch.setenv("MNEME_NVCC_ARCH", "sm_90")
    assert archs("-arch=sm_60") == ["sm_90"]  # the override for build files that hard-code an old GPU


def test_native_without_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigurationError, match="native.*no GPU"):
        archs("-arch=native")
