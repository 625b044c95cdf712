"""The JSON codec of asynchronous DCP saves' markers (worker_sdk/checkpoint/background/dcp_json.py):
real DCP metadata and ``where`` lists come back identical through JSON, the checkpoint finished
from decoded ones loads, and whatever is not of the expected shape is a ValueError."""

from __future__ import annotations

import copy
import json
import pickle
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter, _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.state_dict_loader import load
from torch.distributed.checkpoint.state_dict_saver import save

from tests.fuzz.strategies import FUZZ, json_values
from worker_sdk.checkpoint.background import dcp_async
from worker_sdk.checkpoint.background.arena import Arena
from worker_sdk.checkpoint.background.dcp_json import (
    decode_metadata,
    decode_where,
    encode_metadata,
    encode_where,
)

Where = list[tuple[MetadataIndex, _StorageInfo]]


def _through_json(value: Any) -> Any:
    return json.loads(json.dumps(value, allow_nan=False))


def _plain_state() -> dict[str, Any]:
    """Tensors of several dtypes, and nested containers holding non-tensor values."""
    g = torch.Generator().manual_seed(0)
    return {
        "f32": torch.randn(3, 4, generator=g),
        "bf16": torch.randn(5, generator=g).to(torch.bfloat16),
        "f16": torch.randn(2, 2, generator=g).half(),
        "i64": torch.arange(6).reshape(2, 3),
        "u8": torch.tensor([1, 2, 255], dtype=torch.uint8),
        "flags": torch.tensor([True, False]),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.zeros(0, 3),
        "nested": {"lst": [torch.ones(2), 7, "x"], "step": 3, "cfg": {"lr": 0.1, "name": None}},
    }


def assert_same_state(a: Any, b: Any, where: str = "") -> None:
    """Recursive equality; tensors bit-identical, of the same dtype (local: the checkpointer that
    tests/helpers/states.py imports is not needed here)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype, where
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where
        for k in a:
            assert_same_state(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_state(x, y, f"{where}[{i}]")
    else:
        assert type(a) is type(b) and a == b, f"{where}: {a!r} != {b!r}"


def _replace(md: Metadata, **fields: Any) -> Metadata:
    """A shallow copy of ``md`` with ``fields`` replaced."""
    out = copy.copy(md)
    for k, v in fields.items():
        setattr(out, k, v)
    return out


def _zeros_like(state: Any) -> Any:
    """A state of the same structure to load into: zero tensors, placeholder values."""
    if isinstance(state, torch.Tensor):
        return torch.zeros_like(state)
    if isinstance(state, dict):
        return {k: _zeros_like(v) for k, v in state.items()}
    if isinstance(state, list):
        return [_zeros_like(v) for v in state]
    return "placeholder"


@contextmanager
def _arenas() -> Iterator[tuple[Callable[[int], Arena], list[Arena]]]:
    """An ``arena_for`` for StagingWriter and the arenas it made, closed afterwards."""
    arenas: list[Arena] = []

    def arena_for(size: int) -> Arena:
        arenas.append(Arena.create("test-dcp-json", size))
        return arenas[-1]

    try:
        yield arena_for, arenas
    finally:
        for arena in arenas:
            arena.close()


@contextmanager
def _staged(state: dict[str, Any]) -> Iterator[tuple[list[dcp_async.Item], Metadata, Arena]]:
    """DCP's planning of ``state`` through rvsup's StagingWriter (as dcp_async.stage runs it, in
    one process): its items, the global Metadata object and the arena holding the tensors."""
    with _arenas() as (arena_for, arenas):
        writer = dcp_async.StagingWriter(arena_for)
        save(state, storage_writer=writer, planner=DefaultSavePlanner())
        assert isinstance(writer.metadata, Metadata)
        yield writer.items, writer.metadata, arenas[-1]


def _assert_same_metadata(a: Metadata, b: Metadata) -> None:
    """Field equality, with the types that dataclass equality does not see."""
    assert a == b
    assert list(a.state_dict_metadata) == list(b.state_dict_metadata)
    for fqn, x in a.state_dict_metadata.items():
        y = b.state_dict_metadata[fqn]
        assert type(x) is type(y), fqn
        if isinstance(x, TensorStorageMetadata):
            assert isinstance(y, TensorStorageMetadata)
            assert type(y.size) is torch.Size, fqn
            assert y.properties.memory_format is x.properties.memory_format, fqn
            for c in y.chunks:
                assert type(c.offsets) is torch.Size and type(c.sizes) is torch.Size, fqn
    if a.planner_data is not None:
        assert all(type(path) is tuple for path in b.planner_data.values())


def _assert_same_where(a: Where, b: Where) -> None:
    """Entry equality, the index hints too (MetadataIndex's equality ignores them)."""
    assert a == b
    for (ia, sa), (ib, sb) in zip(a, b, strict=True):
        assert (ia.fqn, ia.offset, ia.index) == (ib.fqn, ib.offset, ib.index)
        assert ib.offset is None or type(ib.offset) is torch.Size
        assert vars(sa) == vars(sb)


def _commit_through_json(state: dict[str, Any], directory: Path) -> tuple[Metadata, Where]:
    """rvsup's asynchronous DCP save of ``state`` into ``directory``, its markers' values sent
    through JSON: dcp_async.stage, write_items, encode, decode, dcp_async.finish_metadata."""
    with _arenas() as (arena_for, arenas):
        items, encoded = dcp_async.stage(state, arena_for, 0)
        where, _ = dcp_async.write_items(items, arenas[-1], directory, 0)
    metadata_json = json.loads(json.dumps(encoded))
    decoded_where = decode_where(json.loads(json.dumps(encode_where(where))))
    _assert_same_where(where, decoded_where)
    dcp_async.finish_metadata(metadata_json, decoded_where, directory)
    return decode_metadata(metadata_json), decoded_where


def test_staged_metadata_of_plain_and_nested_state_round_trips() -> None:
    """Real metadata of several dtypes and nested non-tensor values comes back identical."""
    with _staged(_plain_state()) as (_, metadata, _arena):
        assert metadata.storage_data is None
        decoded = decode_metadata(_through_json(encode_metadata(metadata)))
    _assert_same_metadata(metadata, decoded)
    entries = decoded.state_dict_metadata
    assert isinstance(entries["nested.lst.1"], BytesStorageMetadata)
    bf16 = entries["bf16"]
    assert isinstance(bf16, TensorStorageMetadata)
    assert bf16.properties.dtype is torch.bfloat16
    assert decoded.planner_data["nested.lst.1"] == ("nested", "lst", 1)


def test_the_where_of_written_items_round_trips(tmp_path: Path) -> None:
    """write_items' real (index, storage info) list comes back identical, hints included."""
    with _staged(_plain_state()) as (items, _, arena):
        where, _crc = dcp_async.write_items(items, arena, tmp_path, 0)
    encoded = encode_where(where)
    assert encoded[0]["storage"]["relative_path"] == "__0_0.distcp"
    _assert_same_where(where, decode_where(_through_json(encoded)))


def test_a_checkpoint_finished_from_decoded_markers_loads(tmp_path: Path) -> None:
    """The .metadata finish_metadata writes from decoded values loads the saved state exactly."""
    state = _plain_state()
    _commit_through_json(state, tmp_path)
    loaded = _zeros_like(state)
    load(loaded, storage_reader=FileSystemReader(tmp_path), no_dist=True)
    assert_same_state(state, loaded)


def test_dcp_own_filesystem_checkpoint_round_trips_and_loads(tmp_path: Path) -> None:
    """DCP's FileSystemWriter's metadata, sent through JSON and written back, still loads."""
    state = _plain_state()
    save(state, storage_writer=FileSystemWriter(tmp_path), no_dist=True)
    metadata = FileSystemReader(tmp_path).read_metadata()
    assert metadata.storage_meta is not None
    with pytest.raises(ValueError, match="storage_data: must be None"):
        encode_metadata(metadata)  # the commit sets it, from every rank's where
    where = list(metadata.storage_data.items())
    with pytest.raises(ValueError, match=r"checkpoint_id: expected a string.*PosixPath"):
        encode_metadata(_replace(metadata, storage_data=None))  # a Path would come back a str
    bare = _replace(metadata, storage_data=None, storage_meta=None)
    decoded = decode_metadata(_through_json(encode_metadata(bare)))
    _assert_same_metadata(bare, decoded)
    assert decoded.version == metadata.version
    decoded.storage_data = dict(decode_where(_through_json(encode_where(where))))
    assert decoded.storage_data == metadata.storage_data
    decoded.storage_meta = StorageMeta(checkpoint_id=str(tmp_path), save_id="s")
    (tmp_path / ".metadata").write_bytes(pickle.dumps(decoded))
    loaded = _zeros_like(state)
    load(loaded, storage_reader=FileSystemReader(tmp_path), no_dist=True)
    assert_same_state(state, loaded)


@pytest.mark.usefixtures("one_process_group")
def test_fsdp2_and_dtensor_state_round_trips_and_loads(tmp_path: Path) -> None:
    """An FSDP2 model's and optimizer's state and a DTensor (1-rank gloo group) round-trip and load."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))

    def trained(seed: int) -> dict[str, Any]:
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
        fully_shard(model, mesh=mesh)
        opt = torch.optim.Adam(model.parameters())
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        msd, osd = get_state_dict(model, opt)
        dt = distribute_tensor(torch.randn(6, 2), mesh, [Shard(0)])
        return {"model": msd, "optim": osd, "dt": dt}

    state = trained(1)
    assert isinstance(state["model"]["0.weight"], DTensor)
    with _staged(state) as (_, metadata, _arena):
        _assert_same_metadata(metadata, decode_metadata(_through_json(encode_metadata(metadata))))
    decoded, _ = _commit_through_json(state, tmp_path)
    assert decoded.planner_data["optim.param_groups.0.lr"] == ("optim", "param_groups", 0, "lr")
    dt = decoded.state_dict_metadata["dt"]
    assert isinstance(dt, TensorStorageMetadata) and dt.size == torch.Size([6, 2])
    loaded = trained(2)
    load(loaded, storage_reader=FileSystemReader(tmp_path))

    def full(value: Any) -> Any:
        if isinstance(value, DTensor):
            return value.full_tensor()
        return {k: full(v) for k, v in value.items()} if isinstance(value, dict) else value

    assert not torch.equal(full(trained(2)["dt"]), full(state["dt"]))  # the load changed it
    assert_same_state(full(state["model"]), full(loaded["model"]))
    assert_same_state(full(state["optim"]["state"]), full(loaded["optim"]["state"]))
    assert_same_state(full(state["dt"]), full(loaded["dt"]))


def test_every_torch_dtype_layout_and_memory_format_round_trips() -> None:
    """Each dtype and layout torch has, and DCP's three memory formats, come back as themselves."""
    dtypes = {v for v in vars(torch).values() if isinstance(v, torch.dtype)}
    layouts = {v for v in vars(torch).values() if isinstance(v, torch.layout)}
    formats = [torch.contiguous_format, torch.channels_last, torch.preserve_format]
    assert {torch.bfloat16, torch.int64, torch.float8_e4m3fn} <= dtypes
    assert {torch.strided, torch.sparse_coo} <= layouts
    props = [TensorProperties(dtype=d) for d in dtypes] + [
        TensorProperties(layout=x) for x in layouts
    ]
    props += [
        TensorProperties(memory_format=f, requires_grad=True, pin_memory=True) for f in formats
    ]
    chunk = ChunkStorageMetadata(torch.Size([0]), torch.Size([2]))
    md = Metadata(
        {f"t{i}": TensorStorageMetadata(p, torch.Size([2]), [chunk]) for i, p in enumerate(props)}
    )
    decoded = decode_metadata(_through_json(encode_metadata(md)))
    _assert_same_metadata(md, decoded)
    for i, p in enumerate(props):
        got = decoded.state_dict_metadata[f"t{i}"]
        assert isinstance(got, TensorStorageMetadata)
        assert got.properties.dtype is p.dtype and got.properties.layout is p.layout


def _md() -> dict[str, Any]:
    """A valid encoded metadata to break, one field at a time."""
    props = {
        "dtype": "float32",
        "layout": "strided",
        "requires_grad": False,
        "memory_format": "contiguous_format",
        "pin_memory": False,
    }
    tensor = {
        "type": "tensor",
        "properties": props,
        "size": [4, 2],
        "chunks": [{"offsets": [0, 0], "sizes": [2, 2]}, {"offsets": [2, 0], "sizes": [2, 2]}],
    }
    return {
        "state_dict_metadata": {"w": tensor, "step": {"type": "bytes"}},
        "planner_data": {"w": ["w"], "step": ["opt", "state", 0, "step"]},
        "storage_data": None,
        "storage_meta": {"checkpoint_id": None, "save_id": "s", "load_id": None, "modules": []},
        "version": "1.0.0",
    }


def _deep(depth: int) -> Any:
    nested: Any = []
    for _ in range(depth):
        nested = [nested]
    return nested


def _set(*path: Any, value: Any) -> Callable[[Any], None]:
    def apply(data: Any) -> None:
        for key in path[:-1]:
            data = data[key]
        data[path[-1]] = value

    return apply


def _delete(*path: Any) -> Callable[[Any], None]:
    def apply(data: Any) -> None:
        for key in path[:-1]:
            data = data[key]
        del data[path[-1]]

    return apply


W = ("state_dict_metadata", "w")
P = (*W, "properties")
METADATA_REFUSALS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "top not an object": (
        lambda d: ["not", "metadata"],
        r"^metadata: expected an object, got a list",
    ),
    "top a string": (
        lambda d: "Metadata(...)",
        r"^metadata: expected an object, got 'Metadata\(\.\.\.\)'",
    ),
    "missing key": (_delete("version"), r"^metadata: .*missing \['version'\]"),
    "extra key": (_set("__reduce__", value=1), r"^metadata: .*unknown \['__reduce__'\]"),
    "extra tensor key": (_set(*W, "data", value=[]), r"\['w'\]: .*unknown \['data'\]"),
    "unknown entry type": (
        _set(*W, "type", value="pickle"),
        r"\['w'\]: expected an object whose type",
    ),
    "bytes with a payload": (
        _set("state_dict_metadata", "step", "x", value=1),
        r"\['step'\]: .*unknown",
    ),
    "dtype os.system": (_set(*P, "dtype", value="os.system"), r"dtype: 'os.system' is not a dtype"),
    "dtype Tensor": (_set(*P, "dtype", value="Tensor"), r"dtype: 'Tensor' is not a dtype"),
    "dtype torch.float32": (_set(*P, "dtype", value="torch.float32"), r"dtype: 'torch.float32'"),
    "dtype a layout": (_set(*P, "dtype", value="strided"), r"dtype: 'strided' is not a dtype"),
    "dtype not a string": (_set(*P, "dtype", value=["float32"]), r"dtype: expected a string"),
    "layout a dtype": (_set(*P, "layout", value="float32"), r"layout: 'float32' is not a layout"),
    "memory format 3d": (
        _set(*P, "memory_format", value="channels_last_3d"),
        r"memory_format: .*is not",
    ),
    "memory format eval": (_set(*P, "memory_format", value="__import__('os')"), r"memory_format"),
    "requires_grad an int": (_set(*P, "requires_grad", value=0), r"requires_grad: expected a bool"),
    "negative size": (
        _set(*W, "size", value=[-4, 2]),
        r"size\[0\]: expected an int in \[0, 2\*\*63\)",
    ),
    "float in size": (_set(*W, "size", value=[4.0, 2]), r"size\[0\]: expected an int.*got 4.0"),
    "bool in size": (_set(*W, "size", value=[True, 2]), r"size\[0\]: expected an int.*got True"),
    "string in size": (_set(*W, "size", value=["4", 2]), r"size\[0\]: expected an int"),
    "size past int64": (_set(*W, "size", value=[2**63, 2]), r"size\[0\]: expected an int"),
    "size of 65 dims": (
        _set(*W, "size", value=[1] * 65),
        r"size: expected a list of 0 to 64 items",
    ),
    "size an object": (_set(*W, "size", value={"0": 4}), r"size: expected a list"),
    "offsets of wrong length": (
        _set(*W, "chunks", 0, "offsets", value=[0]),
        r"chunks\[0\]: offsets and sizes need 2 dims",
    ),
    "chunk outside the tensor": (
        _set(*W, "chunks", 1, "offsets", value=[3, 0]),
        r"chunks\[1\]: .* is outside",
    ),
    "chunks not a list": (
        _set(*W, "chunks", value={"offsets": [0, 0]}),
        r"chunks: expected a list",
    ),
    "chunk missing sizes": (
        _delete(*W, "chunks", 0, "sizes"),
        r"chunks\[0\]: .*missing \['sizes'\]",
    ),
    "planner_data a list": (
        _set("planner_data", value=[["w"]]),
        r"planner_data: expected an object",
    ),
    "planner_data dict value": (
        _set("planner_data", "w", value={"a": 1}),
        r"planner_data\['w'\]: expected a list",
    ),
    "planner_data empty": (
        _set("planner_data", "w", value=[]),
        r"planner_data\['w'\]: expected a list of 1 to 64",
    ),
    "planner_data float": (
        _set("planner_data", "w", value=["w", 1.5]),
        r"planner_data\['w'\]\[1\]: expected an int",
    ),
    "planner_data nested": (
        _set("planner_data", "w", value=["w", ["x"]]),
        r"planner_data\['w'\]\[1\]",
    ),
    "planner_data long": (
        _set("planner_data", "w", value=["w"] * 65),
        r"planner_data\['w'\]: expected a list of 1 to 64 items",
    ),
    "planner_data negative": (
        _set("planner_data", "w", value=["w", -1]),
        r"planner_data\['w'\]\[1\]",
    ),
    "huge nesting": (
        _set("planner_data", "w", value=_deep(100_000)),
        r"planner_data\['w'\]\[0\]: .*got a list",
    ),
    "huge nesting as size": (
        _set(*W, "size", value=_deep(100_000)),
        r"size\[0\]: expected an int.*got a list",
    ),
    "storage_data set": (_set("storage_data", value={"w": 1}), r"storage_data: must be None"),
    "storage_meta modules": (
        _set("storage_meta", "modules", value="m"),
        r"modules: expected a list",
    ),
    "checkpoint_id an int": (
        _set("storage_meta", "checkpoint_id", value=3),
        r"checkpoint_id: expected a string",
    ),
    "version with NUL": (_set("version", value="1\0"), r"version: expected a string .*no NUL"),
    "fqn too long": (
        _set("planner_data", "x" * 5000, value=["x"]),
        r"planner_data key: expected a string",
    ),
}


@pytest.mark.parametrize("case", list(METADATA_REFUSALS))
def test_malformed_metadata_is_refused(case: str) -> None:
    """Each malformed encoded metadata is a ValueError naming the field, never another error."""
    assert decode_metadata(_through_json(_md())).version == "1.0.0"  # the base is valid
    data = _md()
    mutate, message = METADATA_REFUSALS[case]
    data = mutate(data) or data
    with pytest.raises(ValueError, match=message):
        decode_metadata(data)


def _where() -> list[Any]:
    """A valid encoded where to break, one field at a time."""
    return [
        {
            "index": {"fqn": "w", "offset": [0, 0], "index": 0},
            "storage": {
                "relative_path": "__0_0.distcp",
                "offset": 0,
                "length": 1203,
                "transform_descriptors": None,
            },
        },
        {
            "index": {"fqn": "step", "offset": None, "index": None},
            "storage": {
                "relative_path": "__0_0.distcp",
                "offset": 1203,
                "length": 9,
                "transform_descriptors": ["zstd"],
            },
        },
    ]


S = (0, "storage")
WHERE_REFUSALS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "top an object": (lambda d: {"w": d[0]}, r"^where: expected a list of"),
    "top a tuple": (tuple, r"^where: expected a list of"),
    "entry a pair list": (
        lambda d: [[d[0]["index"], d[0]["storage"]]],
        r"^where\[0\]: expected an object",
    ),
    "entry missing storage": (_delete(0, "storage"), r"^where\[0\]: .*missing \['storage'\]"),
    "entry extra key": (_set(0, "crc", value=1), r"^where\[0\]: .*unknown \['crc'\]"),
    "index extra key": (
        _set(0, "index", "py/object", value="os.system"),
        r"where\[0\]\.index: .*unknown",
    ),
    "fqn an int": (_set(0, "index", "fqn", value=3), r"where\[0\]\.index\.fqn: expected a string"),
    "offset a string": (_set(0, "index", "offset", value="0,0"), r"index\.offset: expected a list"),
    "offset negative": (
        _set(0, "index", "offset", value=[0, -1]),
        r"index\.offset\[1\]: expected an int",
    ),
    "index hint a float": (_set(0, "index", "index", value=0.0), r"index\.index: expected an int"),
    "negative length": (
        _set(*S, "length", value=-1),
        r"where\[0\]\.storage\.length: expected an int",
    ),
    "offset a bool": (_set(*S, "offset", value=False), r"storage\.offset: expected an int.*False"),
    "length a huge int": (_set(*S, "length", value=10**400), r"storage\.length: .*a huge int"),
    "path with a slash": (
        _set(*S, "relative_path", value="../../etc/passwd"),
        r"relative_path: .* plain file",
    ),
    "path dot-dot": (
        _set(*S, "relative_path", value=".."),
        r"relative_path: '\.\.' is not a plain",
    ),
    "path empty": (_set(*S, "relative_path", value=""), r"relative_path: '' is not a plain"),
    "path with NUL": (_set(*S, "relative_path", value="a\0b"), r"relative_path: expected a string"),
    "descriptors a string": (
        _set(*S, "transform_descriptors", value="zstd"),
        r"transform_descriptors: expected a list",
    ),
    "descriptor an int": (
        _set(*S, "transform_descriptors", value=[1]),
        r"transform_descriptors\[0\]: expected a string",
    ),
    "huge nesting": (
        _set(0, "index", "offset", value=_deep(100_000)),
        r"offset\[0\]: expected an int.*got a list",
    ),
}


@pytest.mark.parametrize("case", list(WHERE_REFUSALS))
def test_malformed_where_is_refused(case: str) -> None:
    """Each malformed encoded where is a ValueError naming the field, never another error."""
    assert len(decode_where(_through_json(_where()))) == 2  # the base is valid
    data = _where()
    mutate, message = WHERE_REFUSALS[case]
    data = mutate(data) or data
    with pytest.raises(ValueError, match=message):
        decode_where(data)


def _tensor_md(**properties: Any) -> Metadata:
    chunk = ChunkStorageMetadata(torch.Size([0]), torch.Size([2]))
    entry = TensorStorageMetadata(TensorProperties(**properties), torch.Size([2]), [chunk])
    return Metadata({"t": entry})


ENCODE_REFUSALS: dict[str, tuple[Callable[[], Any], str]] = {
    "not a Metadata": (lambda: {"state_dict_metadata": {}}, r"^metadata: expected a Metadata"),
    "a Path checkpoint_id": (
        lambda: Metadata({}, storage_meta=StorageMeta(checkpoint_id=Path("/c"))),
        r"storage_meta\.checkpoint_id: expected a string.*PosixPath",
    ),
    "storage_data set": (
        lambda: Metadata({}, storage_data={}),
        r"metadata\.storage_data: must be None",
    ),
    "custom planner_data": (
        lambda: Metadata({}, planner_data=["x"]),
        r"metadata\.planner_data: expected an object",
    ),
    "planner path a list": (
        lambda: Metadata({}, planner_data={"a": ["a"]}),
        r"planner_data\['a'\]: expected a tuple",
    ),
    "planner path a float": (
        lambda: Metadata({}, planner_data={"a": ("a", 1.5)}),
        r"planner_data\['a'\]\[1\]",
    ),
    "an int fqn": (
        lambda: Metadata(cast(Any, {1: BytesStorageMetadata()})),
        r"state_dict_metadata key: expected a string",
    ),
    "an unknown entry": (
        lambda: Metadata(cast(Any, {"t": object()})),
        r"\['t'\]: expected a TensorStorageMetadata",
    ),
    "channels_last_3d": (
        lambda: _tensor_md(memory_format=torch.channels_last_3d),
        r"memory_format: torch\.channels_last_3d is not a memory_format",
    ),
    "a dtype that is not one": (
        lambda: _tensor_md(dtype="float32"),
        r"properties\.dtype: 'float32' is not a dtype",
    ),
    "a size as a list": (
        lambda: Metadata({"t": TensorStorageMetadata(TensorProperties(), cast(Any, [2]), [])}),
        r"\['t'\]\.size: expected a Size",
    ),
    "a chunk outside": (
        lambda: Metadata(
            {
                "t": TensorStorageMetadata(
                    TensorProperties(),
                    torch.Size([2]),
                    [ChunkStorageMetadata(torch.Size([1]), torch.Size([2]))],
                )
            }
        ),
        r"\['t'\]\.chunks\[0\]: .* is outside",
    ),
    "where not pairs": (
        lambda: [(MetadataIndex("w"),)],
        r"^where\[0\]: expected an \(index, storage info\) pair",
    ),
    "where a nested path": (
        lambda: [(MetadataIndex("w"), _StorageInfo("d/__0_0.distcp", 0, 1))],
        r"where\[0\]\.storage\.relative_path: 'd/__0_0\.distcp' is not a plain file name",
    ),
    "where a tuple of descriptors": (
        lambda: [(MetadataIndex("w"), _StorageInfo("f", 0, 1, ("zstd",)))],
        r"transform_descriptors: expected a list",
    ),
    "where a negative offset": (
        lambda: [(MetadataIndex("w"), _StorageInfo("f", -1, 1))],
        r"where\[0\]\.storage\.offset: expected an int in",
    ),
}


@pytest.mark.parametrize("case", list(ENCODE_REFUSALS))
def test_values_that_would_not_come_back_identical_are_not_encoded(case: str) -> None:
    """Encoding a value JSON cannot carry back identically is a ValueError naming the field."""
    make, message = ENCODE_REFUSALS[case]
    value = make()
    with pytest.raises(ValueError, match=message):
        (encode_where if isinstance(value, list) else encode_metadata)(value)


def test_names_are_looked_up_without_importing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dtype name goes nowhere near torch's module __getattr__, which imports submodules by name."""
    asked: list[str] = []

    def spy(name: str) -> Any:
        asked.append(name)
        raise AttributeError(name)

    monkeypatch.setattr(torch, "__getattr__", spy, raising=False)
    for name in ("onnx", "_dynamo", "set_vital", "no_such_dtype", "float32"):
        data = _md()
        data["state_dict_metadata"]["w"]["properties"]["dtype"] = name
        if name == "float32":
            decode_metadata(data)
        else:
            with pytest.raises(ValueError, match=f"dtype: '{name}' is not a dtype"):
                decode_metadata(data)
    assert asked == []


def _paths(data: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    items = (
        data.items()
        if isinstance(data, dict)
        else enumerate(data)
        if isinstance(data, list)
        else ()
    )
    for key, value in items:
        yield from _paths(value, (*prefix, key))


@FUZZ
@given(st.data(), json_values)
def test_any_value_anywhere_decodes_or_is_a_value_error(data: st.DataObject, value: Any) -> None:
    """Any JSON value in place of any part of a valid document is decoded or a ValueError."""
    for base, decode in ((_md(), decode_metadata), (_where(), decode_where)):
        path = data.draw(st.sampled_from(list(_paths(base))))
        doc = value if not path else _set(*path, value=value)(base) or base
        with suppress(ValueError):
            decode(doc)
