"""Asynchronous saves: the staging arena, the writer process and asynchronous DCP."""
