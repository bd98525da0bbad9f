"""mneme: record CUDA kernels from real applications, replay them alone, and tune them."""

__version__ = "0.1.0"
