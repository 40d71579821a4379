"""kvserve: a llama-server compatible inference server with a shared prompt cache."""

__version__ = "0.1.0"
