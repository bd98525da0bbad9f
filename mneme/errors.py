"""Exceptions shared by every layer; each names the file or setting at fault and the fix."""


class MnemeError(Exception):
    """Base of every error mneme raises on purpose (the CLI prints these without a traceback)."""


class ConfigurationError(MnemeError):
    """A replay configuration or option that cannot work (caught before any compilation)."""


class RecordError(MnemeError):
    """A record DB, IR module or snapshot that is missing, corrupt, or of an unknown version."""


class SnapshotError(RecordError):
    """A snapshot file that cannot be read; the message names the file and the byte offset."""


class CompileError(MnemeError):
    """LLVM, ptxas or nvJitLink rejected the kernel."""


class PipelineError(CompileError):
    """A pass pipeline string that does not parse or names an unknown pass."""


class DeviceError(MnemeError):
    """The GPU, its driver, or a driver call failed."""
