"""Run names: kernel and the knobs that differ from the baseline."""

from mneme.config import ExperimentConfiguration, dim3
from mneme.track.naming import knobs, run_name, short_kernel


def test_short_kernel_drops_arguments_and_return_type_keeps_templates():
    assert short_kernel("vecAdd(float const*, float const*, float*, int)") == "vecAdd"
    assert short_kernel("void ns::tile<128, 4>(float*, int)") == "ns::tile<128, 4>"
    assert short_kernel("_Z6vecaddPfS_S_i") == "_Z6vecaddPfS_S_i"
    assert short_kernel("") == "kernel"


def test_names_list_only_what_differs_from_the_baseline():
    base = ExperimentConfiguration(grid=dim3(4096), block=dim3(256))
    cfg = ExperimentConfiguration(grid=dim3(8192), block=dim3(128), passes="default<O2>", specialize=True)
    assert knobs(cfg, base) == ["b128", "g8192", "O2", "spec"]
    assert run_name("vecAdd(float*, int)", cfg, base, 12) == "vecAdd b128 g8192 O2 spec #12"
    assert run_name("vecAdd(float*, int)", base, base, 3) == "vecAdd as recorded #3"
    assert run_name("vecAdd(float*, int)", base, None, -1, role="baseline") == "vecAdd baseline"
    lb = ExperimentConfiguration(grid=dim3(64), block=dim3(16, 16), set_launch_bounds=True, max_threads=256,
                                 min_blocks_per_sm=2, codegen_opt=1)
    assert knobs(lb, base) == ["b16x16", "g64", "cg1", "lb256,2"]
    assert len(run_name("k", ExperimentConfiguration(passes="x" * 500), None, 1)) <= 120
