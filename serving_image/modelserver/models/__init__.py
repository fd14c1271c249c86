"""Model formats. Heavy libraries (torch, transformers) are imported only by the format that needs them."""

from .base import ModelInfo, Prepared, ServedModel, TensorSpec

__all__ = ["ModelInfo", "Prepared", "ServedModel", "TensorSpec"]
