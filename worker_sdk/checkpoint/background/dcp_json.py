"""JSON for the two DCP values that travel in an asynchronous save's markers.

A marker crosses a checkpoint's temporary directory and the network between ranks' writers, and
unpickling one runs whatever it names: these values never travel as pickles. They are strings,
ints, bools and a few torch enums, written as plain JSON values and read back strictly: every
object must have exactly its keys, every value its type and range (sizes and offsets int64s >= 0,
a chunk inside its tensor, a file a plain name, a planner_data path at most 64 strings or ints);
a dtype, layout or memory format comes back only as one of torch's own objects of that type,
found in torch's namespace by name (never evaluated, never imported). Anything else is a
``ValueError`` naming the field. Encoding runs the same checks and refuses what would not come back
identical: a ``Path`` checkpoint id, ``storage_data`` (the commit sets it from every rank's
``where``), ``planner_data`` other than None or DefaultSavePlanner's ``{fqn: (str | int, ...)}``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, NoReturn, cast

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

__all__ = ["decode_metadata", "decode_where", "encode_metadata", "encode_where"]

_MAX_STR = 4096
_Check = Callable[[Any, str], Any]  # (value, field name) -> the value converted, or ValueError


class _Codec(NamedTuple):
    enc: _Check  # python value -> JSON value
    dec: _Check  # JSON value -> python value


def _fail(field: str, what: str) -> NoReturn:
    raise ValueError(f"{field}: {what}")


def _show(x: Any) -> str:
    """A short description of ``x``, whatever it is (never the repr of a container: it may be
    nested deeper than repr can go, or huge)."""
    if isinstance(x, str):
        return repr(x[:80])
    if isinstance(x, (bool, float, torch.dtype, torch.layout, torch.memory_format)) or x is None:
        return str(x)
    if isinstance(x, int):
        return str(x) if x.bit_length() <= 64 else "a huge int"
    return f"a {type(x).__name__}"


def _str(data: Any, field: str) -> str:
    if not isinstance(data, str) or len(data) > _MAX_STR or "\0" in data:
        _fail(field, f"expected a string of at most {_MAX_STR} characters, no NUL: {_show(data)}")
    return data


def _int(data: Any, field: str) -> int:
    if type(data) is not int or not 0 <= data < 2**63:  # not a bool, not a float
        _fail(field, f"expected an int in [0, 2**63), got {_show(data)}")
    return data


def _bool(data: Any, field: str) -> bool:
    if type(data) is not bool:
        _fail(field, f"expected a bool, got {_show(data)}")
    return data


def _file(data: Any, field: str) -> str:
    if _str(data, field) in ("", ".", "..") or "/" in data or "\\" in data:
        _fail(field, f"{_show(data)} is not a plain file name")
    return cast("str", data)


def _null(data: Any, field: str) -> None:
    if data is not None:
        _fail(field, "must be None: the commit sets it from every rank's where")


def _opt(codec: _Codec) -> _Codec:
    def enc(value: Any, field: str) -> Any:
        return None if value is None else codec.enc(value, field)

    def dec(data: Any, field: str) -> Any:
        return None if data is None else codec.dec(data, field)

    return _Codec(enc, dec)


def _each(item: _Check, of: type[Any], into: type[Any], n: range) -> _Check:
    """A check of a sequence of type ``of`` (its length in ``n``), item by item, into ``into``."""

    def check(data: Any, field: str) -> Any:
        if type(data) is not of or len(data) not in n:
            what = f"a {of.__name__} of {n.start} to {n.stop - 1} items"
            _fail(field, f"expected {what}, got {_show(data)}")
        return into(item(x, f"{field}[{i}]") for i, x in enumerate(data))

    return check


def _list(codec: _Codec, n: range = range(2**63 - 1)) -> _Codec:
    return _Codec(_each(codec.enc, list, list, n), _each(codec.dec, list, list, n))


def _sequence(cls: type[Any], n: range, item: _Check) -> _Codec:
    """A torch.Size or a tuple (``cls``) as a JSON list, its length in ``n``."""
    return _Codec(_each(item, cls, list, n), _each(item, list, cls, n))


def _map(codec: _Codec) -> _Codec:
    def each(fn: _Check) -> _Check:
        def check(data: Any, field: str) -> dict[str, Any]:
            if not isinstance(data, dict):
                _fail(field, f"expected an object, got {_show(data)}")
            return {_str(k, f"{field} key"): fn(v, f"{field}[{k!r:.80}]") for k, v in data.items()}

        return check

    return _Codec(each(codec.enc), each(codec.dec))


def _torch_object(kind: type[Any], *only: str) -> _Codec:
    """One of torch's own ``kind`` objects (of ``only`` if given) by its name, looked up in the
    module's namespace: not through its ``__getattr__``, which imports submodules by name."""
    what = f"a {kind.__name__} {list(only) if only else 'of torch'}"

    def enc(value: Any, field: str) -> str:
        name = str(value).removeprefix("torch.") if type(value) is kind else None
        if name is None or vars(torch).get(name) is not value or (only and name not in only):
            _fail(field, f"{_show(value)} is not {what}")
        return name

    def dec(data: Any, field: str) -> Any:
        value = vars(torch).get(_str(data, field))
        if type(value) is not kind or (only and data not in only):
            _fail(field, f"{_show(data)} is not {what}")
        return value

    return _Codec(enc, dec)


def _keys(data: Any, keys: Sequence[str], field: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        _fail(field, f"expected an object, got {_show(data)}")
    if (missing := [k for k in keys if k not in data]) or len(data) > len(keys):
        unknown = [k[:80] if isinstance(k, str) else _show(k) for k in data if k not in keys]
        _fail(field, f"expected the keys {list(keys)}: missing {missing}, unknown {unknown}")
    return data


def _record(cls: type[Any], check: _Check | None = None, **fields: _Codec) -> _Codec:
    """An instance of ``cls`` as an object of exactly ``fields``; ``check`` checks the instance."""

    def enc(value: Any, field: str) -> dict[str, Any]:
        if type(value) is not cls:
            _fail(field, f"expected a {cls.__name__}, got {_show(value)}")
        out = {k: c.enc(getattr(value, k), f"{field}.{k}") for k, c in fields.items()}
        if check is not None:
            check(value, field)
        return out

    def dec(data: Any, field: str) -> Any:
        data = _keys(data, list(fields), field)
        value = cls(**{k: c.dec(data[k], f"{field}.{k}") for k, c in fields.items()})
        if check is not None:
            check(value, field)
        return value

    return _Codec(enc, dec)


def _key(data: Any, field: str) -> str | int:
    return _str(data, field) if isinstance(data, str) else _int(data, field)


def _inside(tensor: TensorStorageMetadata, field: str) -> None:
    for j, c in enumerate(tensor.chunks):
        if not len(c.offsets) == len(c.sizes) == len(tensor.size):
            _fail(f"{field}.chunks[{j}]", f"offsets and sizes need {len(tensor.size)} dims")
        if any(o + s > d for o, s, d in zip(c.offsets, c.sizes, tensor.size)):  # noqa: B905
            _fail(f"{field}.chunks[{j}]", f"{c} is outside the tensor's {tensor.size}")


_STR, _INT, _BOOL = _Codec(_str, _str), _Codec(_int, _int), _Codec(_bool, _bool)
_SIZE = _sequence(torch.Size, range(65), _int)  # torch's own limit on a tensor's dimensions
_FORMATS = ("contiguous_format", "channels_last", "preserve_format")  # what DCP can pickle
_PROPERTIES = _record(
    TensorProperties,
    dtype=_torch_object(torch.dtype),
    layout=_torch_object(torch.layout),
    requires_grad=_BOOL,
    memory_format=_torch_object(torch.memory_format, *_FORMATS),
    pin_memory=_BOOL,
)
_CHUNK = _record(ChunkStorageMetadata, offsets=_SIZE, sizes=_SIZE)
_KINDS = {  # a state dict entry: a tensor's or BYTE_IO's, told apart by a "type" key
    "tensor": _record(
        TensorStorageMetadata, _inside, properties=_PROPERTIES, size=_SIZE, chunks=_list(_CHUNK)
    ),
    "bytes": _record(BytesStorageMetadata),
}


def _storage_enc(value: Any, field: str) -> dict[str, Any]:
    tag = "bytes" if type(value) is BytesStorageMetadata else "tensor"
    return {"type": tag, **_KINDS[tag].enc(value, field)}


def _storage_dec(data: Any, field: str) -> Any:
    tag = data.get("type") if isinstance(data, dict) else None
    if not isinstance(tag, str) or tag not in _KINDS:
        _fail(field, f"expected an object whose type is one of {list(_KINDS)}")
    return _KINDS[tag].dec({k: v for k, v in data.items() if k != "type"}, field)


_METADATA = _record(
    Metadata,
    state_dict_metadata=_map(_Codec(_storage_enc, _storage_dec)),
    planner_data=_opt(_map(_sequence(tuple, range(1, 65), _key))),  # a path: keys and indices
    storage_data=_Codec(_null, _null),
    storage_meta=_opt(
        _record(
            StorageMeta,
            checkpoint_id=_opt(_STR),
            save_id=_opt(_STR),
            load_id=_opt(_STR),
            modules=_list(_STR),
        )
    ),
    version=_opt(_STR),
)
_INDEX = _record(MetadataIndex, fqn=_STR, offset=_opt(_SIZE), index=_opt(_INT))
_INFO = _record(
    _StorageInfo,
    relative_path=_Codec(_file, _file),
    offset=_INT,
    length=_INT,
    transform_descriptors=_opt(_list(_STR, range(17))),
)


def _entry_enc(value: Any, field: str) -> dict[str, Any]:
    if type(value) is not tuple or len(value) != 2:
        _fail(field, f"expected an (index, storage info) pair, got {_show(value)}")
    return {
        "index": _INDEX.enc(value[0], f"{field}.index"),
        "storage": _INFO.enc(value[1], f"{field}.storage"),
    }


def _entry_dec(data: Any, field: str) -> tuple[MetadataIndex, _StorageInfo]:
    data = _keys(data, ["index", "storage"], field)
    return _INDEX.dec(data["index"], f"{field}.index"), _INFO.dec(
        data["storage"], f"{field}.storage"
    )


_WHERE = _list(_Codec(_entry_enc, _entry_dec))


def encode_where(where: Sequence[tuple[MetadataIndex, _StorageInfo]]) -> list[Any]:
    """``write_items``' list of (index, storage info) as JSON values, or ValueError naming what
    JSON cannot carry back identically."""
    where = list(where) if isinstance(where, tuple) else where
    return cast("list[Any]", _WHERE.enc(where, "where"))


def decode_where(data: Any) -> list[tuple[MetadataIndex, _StorageInfo]]:
    """The list :func:`encode_where` made, checked entry by entry, or ValueError naming what is wrong."""
    return cast("list[tuple[MetadataIndex, _StorageInfo]]", _WHERE.dec(data, "where"))


def encode_metadata(md: Metadata) -> dict[str, Any]:
    """DCP's global metadata (before its ``storage_data`` is set) as JSON values, or ValueError
    naming the field JSON cannot carry back identically."""
    return cast("dict[str, Any]", _METADATA.enc(md, "metadata"))


def decode_metadata(data: Any) -> Metadata:
    """The metadata :func:`encode_metadata` made, checked field by field, or ValueError naming
    what is wrong."""
    return cast("Metadata", _METADATA.dec(data, "metadata"))
