"""Stand-in for torchvision in the elastic benchmark test (see ../README.md)."""

from torchvision import models

__all__ = ["models"]
