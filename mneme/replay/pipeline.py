"""The replay pipeline (the seeds' BaseExecutor): one recorded instance, many configurations.

    ReplayPipeline(db, rid)          reads the record; links the kernel's IR once (clone per experiment)
      .compile(config)               IR half, no GPU: specialize -> optimize -> PTX -> cubin (cached)
      .open()                        GPU half, once: device, arena at the recorded VA, prologue loaded
      .run(compiled, config)         first run verified against the epilogue, the following runs timed
      .execute(config)               both

Memory discipline between experiments: before the verification launch and before every timed launch
only the bytes the recorded kernel writes are restored (device to device); after a failed
verification or any error everything is restored from the host copy, so a bad configuration never
leaks into the next one.
"""

from __future__ import annotations

import statistics
import time
from datetime import datetime, timezone
from typing import Any, Dict, Optional

from mneme.config import ExperimentConfiguration, ExperimentResult, MeasurementSettings
from mneme.errors import CompileError, ConfigurationError, DeviceError, MnemeError, PipelineError, RecordError
from mneme.ir import CompileCache, CompiledKernel, compile_kernel, kernel_params, static_hash as ir_static_hash
from mneme.ir.appbuild import APP_BUILD, Baseline
from mneme.ir.appbuild import choose as choose_baseline
from mneme.record import integrity
from mneme.record.db import RecordedExecution
from mneme.record.memstate import written_state
from mneme.replay.devstate import failure_notes, with_notes
from mneme.replay.verify import Verifier
from mneme.snapshot import Snapshot

#: status of a result that was compiled but never meant to run (compile-only experiments)
COMPILED = "compiled"

#: CUDA errors that mean "this launch shape/size cannot run" rather than "the kernel broke"
_INVALID_LAUNCH = {
    "CUDA_ERROR_INVALID_VALUE",
    "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
    "CUDA_ERROR_INVALID_CONFIGURATION",
    "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE",
}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def recorded_arch(record: RecordedExecution) -> Optional[str]:
    prov = record.provenance or {}
    for key in ("sm", "Arch", "arch", "sm_arch"):
        if prov.get(key):
            a = str(prov[key])
            return a if a.startswith("sm_") else f"sm_{a}"
    return None


def fill_compile_metrics(result: ExperimentResult, ck: CompiledKernel) -> None:
    result.code_hash = ck.code_hash
    result.preprocess_ir_time = ck.preprocess_ir_time
    result.opt_time = ck.opt_time
    result.ptx_time = ck.ptx_time
    result.cubin_time = ck.cubin_time
    result.codegen_time = ck.codegen_time
    result.obj_size = ck.obj_size
    result.cache_hit = ck.cache_hit
    res = ck.cubin
    result.reg_usage = res.registers
    result.local_mem_usage = res.local_mem
    result.const_mem_usage = res.const_mem
    result.shared_mem_usage = res.shared_mem
    result.spill_stores = res.spill_stores
    result.spill_loads = res.spill_loads
    result.stack_size = res.stack
    result.ptx_instructions = ck.ptx_instructions
    result.binary_digest = ck.binary


class ReplayPipeline:
    """Replays one kernel instance of a record DB under replay configurations."""

    def __init__(
        self,
        record_db: str,
        record_id: Optional[str] = None,
        device_id: Optional[int] = 0,
        settings: Optional[MeasurementSettings] = None,
        cache_dir: Optional[str] = None,
        cache: Optional[CompileCache] = None,
        baseline: str = APP_BUILD,
    ):
        self.record_db = str(record_db)
        #: which code the baseline compiles: the app's build (mneme.ir.appbuild) or mneme's defaults
        self.baseline_kind = baseline
        self._baseline: Optional[Baseline] = None
        self.record = RecordedExecution.from_json(self.record_db)
        if not self.record.replayable:
            raise RecordError(f"{self.record_db}: kernel is not replayable: {self.record.not_replayable_reason}")
        self.instance = self.record.instance(record_id)
        self.record_id = self.instance.dynamic_hash
        self.device_id = device_id
        self.settings = settings or MeasurementSettings()
        self.cache = cache if cache is not None else CompileCache(cache_dir)
        self._linked: Dict[bool, Any] = {}
        self._static_hash: Optional[str] = None
        self._arg_values: Optional[Dict[int, bytes]] = None
        self.link_time = 0.0
        # GPU state (open())
        self.device = None
        self._arena = None
        self._state = None
        self._prologue: Optional[Snapshot] = None
        self._expected: Optional[Snapshot] = None
        self._written = None
        self._textures = None
        self._surfaces_written = False
        self._launch_args = None
        self._modules: Dict[str, Any] = {}
        self._code_tables: Optional[Dict[str, Any]] = None
        #: the last loaded module's code map (mneme.replay.codemap), None without code tables
        self.code_map = None
        self.verifier = None
        #: recorded context limits the context refused (Device.set_limits), named in failures
        self.limit_problems: Dict[str, str] = {}

    # -- the IR half ----------------------------------------------------------------------------
    @property
    def arch(self) -> str:
        return self.settings.arch or recorded_arch(self.record) or "sm_90"

    @property
    def instance_attributes(self) -> Dict[str, Any]:
        """How the app launched this instance (Api, Cooperative, Cluster ...), as the recorder saw it."""
        return dict((self.record.extra.get("InstanceAttributes") or {}).get(self.record_id) or {})

    @property
    def kernel_name(self) -> str:
        return self.record.kernel_name

    @property
    def baseline(self) -> Baseline:
        """Which code the baseline replays and why (mneme.ir.appbuild): the app's recorded build settings."""
        if self._baseline is None:
            build = self.record.extra.get("BuildSettings")
            text = str(self.linked()) if build and self.baseline_kind == APP_BUILD else ""
            self._baseline = choose_baseline(self.baseline_kind, build, self.arch, text,
                                             self.record.extra.get("OtherUnitFunctions") or ())
        return self._baseline

    def baseline_config(self) -> ExperimentConfiguration:
        """The recorded launch compiled as the app was built (`baseline`; mneme's defaults when the record has
        no build settings): the configuration a speedup is measured against."""
        inst = self.instance
        return self.baseline.apply(ExperimentConfiguration(grid=inst.grid_dim, block=inst.block_dim,
                                                           shared_mem=inst.shared_mem))

    def linked(self, internalize: bool = True):
        """The kernel's linked, pruned IR; `internalize=False` keeps its helpers' linkage (an rdc app's code)."""
        if internalize not in self._linked:
            from mneme.ir import link_modules

            t0 = time.perf_counter()
            if internalize:
                mod = self.record.link_llvm_modules(prune=True, internalize=True)
            else:
                mod = link_modules(self.record.checked_modules(), self.kernel_name, prune=True, internalize=False)
            self._linked[internalize] = mod
            if self._static_hash is not None:
                return mod
            # The code hash (the compile cache's key) extends the static hash of the IR actually compiled, never
            # the DB's word for it: IR that differs from what was recorded must not be served recorded code.
            # Linkage does not enter it, so both links hash alike (the code hash tells them apart).
            self._static_hash = ir_static_hash(mod, self.kernel_name)
            if self.record.static_hash != self._static_hash and len(self.record.static_hash) == 64:
                raise RecordError(
                    f"{self.record_db}: its IR module(s) {', '.join(self.record.llvm_files)} hash to static hash "
                    f"{self._static_hash[:16]}..., the DB records {self.record.static_hash[:16]}...: the IR was "
                    "changed after recording or belongs to another kernel; restore it or record again"
                )
            self.link_time = time.perf_counter() - t0
        return self._linked[internalize]

    def arg_values(self) -> Dict[int, bytes]:
        """Recorded bytes of the parameters the DB allows to specialize (the prologue's argument buffer)."""
        if self._arg_values is None:
            allowed = set(self.instance.available_specializations)
            values: Dict[int, bytes] = {}
            if allowed:
                params = kernel_params(self.linked(), self.kernel_name)
                with Snapshot.read(self.instance.checked_prologue()) as pro:
                    # the values baked into the code must be this instance's: check the file is its prologue
                    integrity.check_prologue(self.instance, pro, self.record_db, self.instance_attributes)
                    args = pro.args
                    for p in params:
                        if p.index in allowed and p.specializable and p.index < len(args):
                            values[p.index] = bytes(args[p.index])
            self._arg_values = values
        return self._arg_values

    def check_config(self, config: ExperimentConfiguration) -> None:
        max_shared = None
        if self.device is not None:
            max_shared = self.device.info.max_shared_per_block_optin
        problems = config.problems(max_shared) if max_shared else config.problems()
        if problems:
            raise ConfigurationError("invalid replay configuration: " + "; ".join(problems))

    def compile(self, config: ExperimentConfiguration, keep_ll: bool = False) -> CompiledKernel:
        self.check_config(config)
        linked = self.linked(config.internalize)
        return compile_kernel(
            linked,
            self.kernel_name,
            config,
            arch=self.arch,
            static_hash=self._static_hash,
            arg_values=self.arg_values() if config.specialize else None,
            cache=self.cache,
            keep_ll=keep_ll,
            no_inline=self.record.extra.get("OtherUnitFunctions") or (),
        )

    def new_result(self, config: ExperimentConfiguration) -> ExperimentResult:
        r = ExperimentResult(start_time=_now(), config_hash=config.hash())
        if self.device_id is not None:
            r.gpu_id = int(self.device_id)
        return r

    def compile_only(self, config: ExperimentConfiguration, keep_ll: bool = False) -> ExperimentResult:
        """Compile metrics without a GPU: resources, size, per-stage times."""
        result = self.new_result(config)
        try:
            ck = self.compile(config, keep_ll=keep_ll)
            fill_compile_metrics(result, ck)
            result.status = COMPILED
        except (ConfigurationError, PipelineError) as e:
            result.failed, result.error, result.status = True, str(e), "invalid_config"
        except (CompileError, MnemeError) as e:
            result.failed, result.error, result.status = True, str(e), "compile_error"
        result.end_time = _now()
        return result

    # -- the GPU half ---------------------------------------------------------------------------
    def open(self) -> "ReplayPipeline":
        if self._state is not None:
            return self
        from mneme.device import Arena, ReplayState

        try:
            self._open_device()
            self._arena = Arena(self.device, self.record.vaddr, self.record.va_size)
            if self._prologue is None:
                self._prologue = Snapshot.read(self.instance.checked_prologue())
            self._expected = Snapshot.read(self.instance.checked_epilogue())
            integrity.check_snapshot_kinds(self._prologue, self._expected, self.record_db)
            integrity.check_prologue(self.instance, self._prologue, self.record_db, self.instance_attributes)
            if not self._expected.is_full:
                self._expected.apply(self._prologue)
            self._state = ReplayState(self.device, self._prologue)
            self._open_textures()
            self.verifier = Verifier(self)
            blobs, variables = written_state(self._expected, self._prologue)
            self._written = list(blobs) + [
                (v.addr + off, n) for v in self._prologue.variables for off, n in variables.get(v.name, [])
            ]
        except BaseException:
            self.close()
            raise
        return self

    def _open_device(self) -> None:
        from mneme.device import Device

        device_id = 0 if self.device_id is None else int(self.device_id)
        self.device = Device(device_id, timeout=self.settings.timeout)
        want = recorded_arch(self.record)
        if want and self.device.arch != want and not self.settings.arch:
            raise DeviceError(
                f"{self.record_db} was recorded on {want}; this GPU ({self.device.name}) is {self.device.arch}. "
                f"Pass --arch {self.device.arch} to replay it here anyway"
            )
        limits = self.instance_attributes.get("ContextLimits") or {}
        if limits:  # before any module loads: the heap size cannot change after a kernel that uses malloc ran
            self.limit_problems = self.device.set_limits(limits)

    def close(self) -> None:
        for m in self._modules.values():
            try:
                m.unload()
            except MnemeError:
                pass
        self._modules.clear()
        self._launch_args = None
        for attr in ("_textures", "_state", "_arena"):
            obj = getattr(self, attr)
            if obj is not None:
                try:
                    obj.close()
                except MnemeError:
                    pass
                setattr(self, attr, None)
        for attr in ("_prologue", "_expected"):
            obj = getattr(self, attr)
            if obj is not None:
                obj.close()
                setattr(self, attr, None)

    def _open_textures(self) -> None:
        """Recreates the instance's texture/surface objects and puts their handles into the arguments."""
        from mneme.device import KernelArgs
        from mneme.device.textures import Textures
        from mneme.record.textures import replay_args

        args = self._prologue.args
        textures = self.instance_attributes.get("Textures") or []
        if not textures:
            self._launch_args = args
            return
        self._textures = Textures(self.device, self._prologue)
        self._surfaces_written = any(t.get("Written") for t in textures)
        raw = replay_args(bytes(args.raw), textures, self._textures.handle)
        self._launch_args = KernelArgs(raw, args.offsets, args.sizes)

    @property
    def launch_args(self):
        """The prologue's arguments, with replay's texture/surface handles in place of the recorded ones."""
        return self._launch_args if self._launch_args is not None else self._prologue.args

    def _reset_ranges(self):
        """What is restored before every run: the bytes the kernel writes, and with settings.rewrite_inputs all
        of its recorded memory (the app's producer rewrote its inputs just before it)."""
        if not self.settings.rewrite_inputs:
            return self._written
        return list(self._written) + [(b.addr, b.size) for b in self._prologue.blobs]

    def args_for(self, mod):
        """The arguments a launch from `mod` takes: launch_args, with a function-pointer parameter's app address
        replaced by the module's own address of that function (mneme.replay.codemap)."""
        return getattr(mod, "replay_args", None) or self.launch_args

    @property
    def code_tables(self):
        """The linked IR's variables that hold device function addresses (mneme.ir.codeaddr), read once."""
        if self._code_tables is None:
            from mneme.ir.codeaddr import code_tables

            self._code_tables = code_tables(self.linked())
        return self._code_tables

    def _map_code(self, mod) -> None:
        """The module's code map and relocated arguments (mneme.replay.codemap), before its variables load."""
        from mneme.replay import codemap

        if self.code_tables:
            self.code_map = codemap.attach(mod, self.code_tables, self._prologue, self.launch_args,
                                           self.record.extra.get("FunctionPointerParams") or [],
                                           self.record.arg_names, f"{self.record_db}: ")

    def reset_all(self, mod) -> None:
        """Everything back to the prologue from the host copy: memory, the module's variables, arrays."""
        self._state.reset_all(mod)
        if self._textures is not None:
            self._textures.reset()

    def __enter__(self) -> "ReplayPipeline":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    def _module(self, ck: CompiledKernel):
        from mneme.device import DeviceModule

        mod = self._modules.get(ck.code_hash)
        if mod is None:
            mod = DeviceModule.from_cubin(ck.cubin.cubin, self.device)
            self._map_code(mod)
            mod.load_variables(self._prologue)
            if len(self._modules) >= 16:  # keep the loaded working set small; cubins stay in the cache
                old = next(iter(self._modules))
                self._modules.pop(old).unload()
            self._modules[ck.code_hash] = mod
        return mod

    def run(self, ck: CompiledKernel, config: ExperimentConfiguration, result: Optional[ExperimentResult] = None) -> ExperimentResult:
        """Verify once, then time; the result carries the status the tuner reads."""
        if self._state is None:
            self.open()
        from mneme.device import CudaError, DeviceTimeout

        r = result or self.new_result(config)
        fill_compile_metrics(r, ck)
        r.gpu_id, r.gpu_name = self.device.ordinal, self.device.name
        s = self.settings
        mod = None
        try:
            self.check_config(config)
            self.verifier.prepare()  # calibration (settings.verify_runs) runs before the trial's launch
            mod = self._module(ck)
            fn = mod.get_function(self.kernel_name)
            if self.instance_attributes.get("Cooperative"):
                fn.set_cooperative(True)
            attrs = fn.attributes()
            r.reg_usage, r.local_mem_usage, r.const_mem_usage = attrs.num_regs, attrs.local_bytes, attrs.const_bytes
            r.occupancy = fn.occupancy(config.block, config.shared_mem)
            args = self.args_for(mod)
            self._state.plan_resets(self._reset_ranges(), mod)
            self._state.reset_written(None, mod)
            if self._surfaces_written:
                self._textures.reset()  # arrays a surface wrote in an earlier run (timed runs only overwrite them)
            fn.launch(config.grid, config.block, config.shared_mem, args)
            r.executed = True
            verdict = self.verifier.judge(mod)
            r.verified = bool(verdict.passed)
            r.max_abs_err, r.max_rel_err = verdict.max_abs_err, verdict.max_rel_err
            r.verification = str(verdict)[:4000]
            if not r.verified:
                r.status = "failed_verification"
                r.error = r.verification
                self.reset_all(mod)
            else:
                r.exec_time = fn.profile(
                    config.grid, config.block, config.shared_mem, args,
                    iterations=s.iterations, warmup=s.warmup, l2_flush=s.l2_flush, state=self._state,
                )
                r.status = "verified"
                med = statistics.median(r.exec_time) if r.exec_time else None
                inapp = self.instance.in_app_time_ns
                if med and inapp:
                    r.fidelity = float(med) / float(inapp)
        except ConfigurationError as e:
            r.failed, r.status, r.error = True, "invalid_config", str(e)
        except DeviceTimeout as e:
            r.failed, r.status, r.error = True, "timeout", str(e)
        except CudaError as e:
            r.failed, r.error = True, str(e)
            r.status = "invalid_launch" if (e.name in _INVALID_LAUNCH and not e.sticky) else "runtime_error"
            if not e.sticky:
                self._safe_reset(mod)
        except DeviceError as e:
            r.failed, r.status, r.error = True, "runtime_error", str(e)
            self._safe_reset(mod)
        if r.failed or (r.executed and not r.verified):
            r.error = with_notes(r.error, failure_notes(self.record, self.record_db, self.limit_problems))
        r.end_time = _now()
        return r

    def _safe_reset(self, mod) -> None:
        try:
            self.reset_all(mod)
        except MnemeError:
            pass

    @property
    def usable(self) -> bool:
        """False once a sticky CUDA error or a timeout has poisoned this process's context."""
        return self.device is None or self.device.usable

    def execute(self, config: ExperimentConfiguration, keep_ll: bool = False) -> ExperimentResult:
        r = self.new_result(config)
        try:
            ck = self.compile(config, keep_ll=keep_ll)
        except (ConfigurationError, PipelineError) as e:
            r.failed, r.status, r.error, r.end_time = True, "invalid_config", str(e), _now()
            return r
        except MnemeError as e:
            r.failed, r.status, r.error, r.end_time = True, "compile_error", str(e), _now()
            return r
        return self.run(ck, config, r)


def compile_only(record_db: str, record_id: Optional[str], config: ExperimentConfiguration,
                 settings: Optional[MeasurementSettings] = None) -> ExperimentResult:
    return ReplayPipeline(record_db, record_id, device_id=None, settings=settings).compile_only(config)
