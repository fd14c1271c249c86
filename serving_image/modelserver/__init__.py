"""modelserver: a dynamic-batching inference server speaking the Open Inference Protocol v2."""

__version__ = "0.1.0"
