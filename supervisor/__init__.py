"""rvsup: a fault-tolerant supervisor for PyTorch training (the daemon; never imports torch)."""

__all__ = ["__version__"]

__version__ = "0.1.0"
