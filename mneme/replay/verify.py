"""Verification of replayed runs on the GPU: the policy of mneme.record.verification, run by the core.

    v = Verifier(pipeline)       # after pipeline.open(): element types from the IR, annotations, settings
    v.prepare()                  # with settings.verify_runs > 0: calibrate (baseline runs, scratch evidence)
    verdict = v.judge(mod)       # after a launch: a Verdict naming every buffer and how it was compared

Calibration replays the recorded configuration (the baseline compile, the recorded launch, the
prologue restored from the host before each run) `verify_runs` times and dumps each run's state as a
snapshot file; `Calibration.learn` finds the bytes that vary between those states and the recorded
epilogue. Varying bytes of buffers that are not floats are candidates for scratch: one more run with
exactly those bytes poisoned (0xA5) before the launch must leave every other byte of the state as
the plan expects; then nothing else the kernel writes depends on them, and they are skipped (the
verdict quotes this evidence). Otherwise they stay exact and the verdict says so.

The checks themselves run in the GPU core (ReplayState.verify, mneme/data/compare.ptx for large
buffers); a buffer that fails is read back once to show its first differing elements as values.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Dict, List, Optional

from mneme.errors import ConfigurationError, MnemeError
from mneme.record.verdict import BufferVerdict, Verdict, buffer_verdict
from mneme.record.verification import BufferPolicy, Calibration, Key, buffer_types, plan_of, policies
from mneme.snapshot import Check, Snapshot, SnapshotType, Writer

#: byte pattern written over scratch candidates for the evidence run
POISON = 0xA5
#: a failed buffer larger than this is not read back for values (the core's summary is shown)
READBACK_LIMIT = 256 << 20


class Verifier:
    """The verification policy and judge of one open ReplayPipeline."""

    def __init__(self, pipe: Any) -> None:
        self.pipe = pipe
        self.calibration: Optional[Calibration] = None
        self.policies: List[BufferPolicy] = []
        self.plan = []
        self.types: Dict[Key, str] = {}
        self.names: Dict[Key, str] = {}
        self.type_error = ""
        self._prepared = False

    # -- policy
    def element_types(self) -> None:
        """Element types of the blobs the kernel's pointer arguments point into and of the variables."""
        from mneme.ir.elemtypes import global_elem_types, pointer_elem_types

        pipe = self.pipe
        try:
            elems = pointer_elem_types(pipe.linked(), pipe.kernel_name)
            var_elems = global_elem_types(pipe.linked(), [v.name for v in pipe._expected.variables])
        except MnemeError as e:  # no IR types: values are shown as bytes, floats get no tolerance
            elems, var_elems, self.type_error = {}, {}, str(e)
        self.types, self.names = buffer_types(pipe._prologue, elems, pipe.record.arg_names)
        self.types.update({("variable", name): e for name, e in var_elems.items()})

    def _policies(self) -> None:
        s = self.pipe.settings
        self.policies = policies(self.pipe._expected, types=self.types, names=self.names,
                                 calibration=self.calibration, float_rtol=s.float_rtol, atol=s.atol, rtol=s.rtol,
                                 tol_type=s.tol_type)
        self.plan = plan_of(self.policies)

    def prepare(self) -> None:
        """Element types, calibration (when asked for) and the plan; once per open pipeline."""
        if self._prepared:
            return
        self.element_types()
        runs = int(self.pipe.settings.verify_runs or 0)
        if runs == 1 or runs < 0:
            raise ConfigurationError(f"--verify-runs {runs}: calibration needs at least 2 replays of the recorded "
                                     "configuration to see what varies between them (0 turns it off)")
        if runs > 0:
            self.calibration = self.calibrate(runs)
        self._policies()
        self._prepared = True

    # -- calibration
    def calibrate(self, runs: int) -> Calibration:
        pipe = self.pipe
        ck = pipe.compile(pipe.baseline_config())
        mod = pipe._module(ck)
        fn = mod.get_function(pipe.kernel_name)
        if pipe.instance_attributes.get("Cooperative"):
            fn.set_cooperative(True)
        inst = pipe.instance
        launch = (inst.grid_dim, inst.block_dim, inst.shared_mem)
        states: List[Snapshot] = []
        with tempfile.TemporaryDirectory(prefix="mneme-calibrate-") as tmp:
            try:
                for i in range(runs):
                    pipe.reset_all(mod)
                    fn.launch(*launch, pipe.args_for(mod))
                    states.append(capture(pipe._expected, mod, os.path.join(tmp, f"run{i}.epilogue")))
                cal = Calibration.learn(pipe._expected, states, self.types, pipe.settings.verify_margin)
            finally:
                for st in states:
                    st.close()
                pipe.reset_all(mod)
            self._scratch_evidence(cal, mod, fn, launch)
        return cal

    def _scratch_evidence(self, cal: Calibration, mod: Any, fn: Any, launch) -> None:
        """Varying bytes of non-float blobs are scratch if a run with them poisoned leaves every other
        byte as the plan expects: first the whole blobs (skipped entirely), else only the varying bytes."""
        candidates = [k for k in cal.varying if k not in cal.elem and k not in cal.permuted and k[0] == "blob"]
        if not candidates:
            return
        sizes = {("blob", b.addr): b.size for b in self.pipe._expected.blobs}
        for what, ranges in (("the whole buffer", {k: [(0, sizes[k])] for k in candidates}),
                             ("its varying bytes", {k: cal.varying[k] for k in candidates})):
            if self._poison_run(cal, ranges, mod, fn, launch):
                for k in candidates:
                    n = sum(length for _, length in cal.varying[k])
                    cal.scratch[k] = (f"{n} B differed across {cal.states} identical runs; a run with {what} "
                                      f"poisoned (0x{POISON:02X}) before the launch left every other byte as expected")
                    cal.scratch_ranges[k] = ranges[k]
                return

    def _poison_run(self, cal: Calibration, ranges: Dict[Key, list], mod: Any, fn: Any, launch) -> bool:
        from mneme.device.memory import fill

        pipe, s = self.pipe, self.pipe.settings
        trial = Calibration(states=cal.states, margin=cal.margin, varying=dict(cal.varying), spread=dict(cal.spread),
                            elem=dict(cal.elem), scratch={k: "candidate" for k in ranges}, scratch_ranges=dict(ranges),
                            permuted=dict(cal.permuted))
        plan = plan_of(policies(pipe._expected, types=self.types, names=self.names, calibration=trial,
                                float_rtol=s.float_rtol, atol=s.atol, rtol=s.rtol, tol_type=s.tol_type))
        try:
            pipe.reset_all(mod)
            for k, rs in ranges.items():
                for off, n in rs:
                    fill(k[1] + off, POISON, n)
            fn.launch(*launch, pipe.args_for(mod))
            return bool(pipe._state.verify(pipe._expected, plan, mod).equal)
        finally:
            pipe.reset_all(mod)

    # -- judging a run
    def judge(self, mod: Any) -> Verdict:
        """Compares the replayed state (after a launch) with the expected epilogue under the plan."""
        self.prepare()
        pipe = self.pipe
        report = pipe._state.verify(pipe._expected, self.plan, mod)
        verdict = Verdict(passed=bool(report.equal), layout=list(report.differences),
                          calibration=self.calibration.summary() if self.calibration else "")
        by_key: Dict[Key, list] = {}
        for r in report.results:
            by_key.setdefault((r.check.kind, r.check.key), []).append(r)
        expected = {("blob", b.addr): b.contents for b in pipe._expected.blobs}
        expected.update({("variable", v.name): v.contents for v in pipe._expected.variables})
        for p in self.policies:
            results = by_key.get(p.key)
            if results is None and p.checks:
                continue  # a layout problem or a variable the module lacks (report.skipped)
            results = results or []  # a buffer skipped whole as scratch
            if p.how.endswith("multiset"):  # order-free: the whole buffer back to the host, compared there
                verdict.buffers.append(_multiset_verdict(p, expected[p.key]))
                verdict.passed = verdict.passed and verdict.buffers[-1].passed
                continue
            ok = all(r.equal for r in results)
            tolerant = [r for r in results if not r.check.exact]
            bv = BufferVerdict(p, passed=ok, mismatches=sum(r.mismatches for r in results),
                               max_abs_err=max((r.max_abs_err for r in tolerant), default=0.0),
                               max_rel_err=max((r.max_rel_err for r in tolerant), default=0.0))
            if not ok:
                actual = _read_buffer(p, mod)
                if actual is not None:
                    cpu = buffer_verdict(p, expected[p.key], actual)
                    bv.details = cpu.details
                    bv.max_abs_err, bv.max_rel_err = max(bv.max_abs_err, cpu.max_abs_err), max(bv.max_rel_err,
                                                                                              cpu.max_rel_err)
                else:
                    bv.details = [str(r) for r in results if not r.equal]
            verdict.buffers.append(bv)
        for bv in self.array_verdicts():
            verdict.buffers.append(bv)
            verdict.passed = verdict.passed and bv.passed
        verdict.skipped = list(report.skipped)
        return verdict

    def array_verdicts(self) -> List[BufferVerdict]:
        """The CUDA arrays behind the kernel's surfaces and textures, read back and compared exactly (as
        elements of the array's format) with the epilogue's contents."""
        pipe = self.pipe
        if pipe._textures is None:
            return []
        out = []
        for a in pipe._expected.arrays:
            n = len(a.contents)
            dims = "x".join(str(d) for d in (a.width, a.height, a.depth) if d)
            label = f"{dims}{f', {a.levels} levels' if a.levels else ''}"
            p = BufferPolicy(("array", a.handle), a.handle, n, name=label, elem=a.elem,
                             elem_source="the array's format", checks=[Check("array", a.handle, a.handle, 0, n, a.elem)])
            out.append(buffer_verdict(p, a.contents, memoryview(pipe._textures.read(a.handle, n))))
        return out


def _multiset_verdict(p: BufferPolicy, expected) -> BufferVerdict:
    from mneme.device.memory import read

    return buffer_verdict(p, expected, memoryview(read(p.base, p.size)))


def _read_buffer(p: BufferPolicy, mod: Any) -> Optional[bytes]:
    from mneme.device.memory import read

    if p.size > READBACK_LIMIT:
        return None
    try:
        if p.key[0] == "blob":
            return read(p.base, p.size)
        addr, size = mod.global_address(str(p.key[1]))
        return read(addr, min(size, p.size))
    except MnemeError:
        return None


def capture(expected: Snapshot, mod: Any, path: str) -> Snapshot:
    """The replayed state now on the device, with `expected`'s layout, as a full epilogue file."""
    from mneme.device.memory import read

    with Writer(path, SnapshotType.EPILOGUE) as w:
        for b in expected.blobs:
            w.blob(b.addr, read(b.addr, b.size), b.space)
        for v in expected.variables:
            try:
                addr, size = mod.global_address(v.name)
            except MnemeError:
                continue  # optimized away: the verdict reports it as skipped
            w.variable(v.name, v.addr, read(addr, min(size, v.size)), v.is_const)
    return Snapshot.read(path)
