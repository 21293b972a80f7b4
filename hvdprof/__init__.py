"""hvdprof: a Horovod-compatible collective runtime for PyTorch that you can see and tune."""

from hvdprof.errors import (
    ConfigError,
    HvdprofError,
    HvdprofInternalError,
    NotInitializedError,
    TensorMismatchError,
)

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "HvdprofError",
    "HvdprofInternalError",
    "NotInitializedError",
    "TensorMismatchError",
    "__version__",
]
