"""Dump I/O: read (lazily, validated) and write format-v1 safetensors dumps."""

from kvcanary_cli.dump.loader import GROUPS, DtypeNote, KvDump, Scalar, TensorInfo, load_dump
from kvcanary_cli.dump.writer import save_dump

__all__ = ["GROUPS", "DtypeNote", "KvDump", "Scalar", "TensorInfo", "load_dump", "save_dump"]
