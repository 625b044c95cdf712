"""rvsup: a fault-tolerant supervisor for PyTorch training (the daemon; never imports torch)."""

__version__ = "0.1.0"
