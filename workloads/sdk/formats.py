"""Model files <-> Flower ArrayRecords: .npz, Flower ArrayRecord, torch .pt/.pth, safetensors.

Every format is read into an ArrayRecord whose keys are the tensor names, in file order (a
torch ``state_dict`` keeps its order, so ``record.to_torch_state_dict()`` loads straight into
the model). Checkpoints are written as .npz (named arrays, readable with numpy alone).

| suffix | what it holds |
|---|---|
| ``.npz`` | named numpy arrays (``np.savez``), no pickles |
| ``.arrayrecord`` | a Flower ``ArrayRecord`` as its protobuf bytes (``write_arrayrecord``) |
| ``.pt``, ``.pth`` | a torch ``state_dict`` (``torch.save(model.state_dict(), path)``), or a dict
  holding one under ``state_dict`` / ``model_state_dict`` / ``model``; loaded with
  ``weights_only=True``, so no code in the file runs |
| ``.safetensors`` | safetensors tensors |
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

import numpy as np
import numpy.typing as npt
from flwr.app import Array, ArrayRecord

Arrays = dict[str, npt.NDArray[Any]]
SUFFIXES = (".npz", ".arrayrecord", ".pt", ".pth", ".safetensors")
STATE_DICT_KEYS = ("state_dict", "model_state_dict", "model")


class ModelFormatError(ValueError):
    """A model file cannot be read; the message names the file and what is wrong."""


def to_record(arrays: Mapping[str, npt.NDArray[Any]] | ArrayRecord) -> ArrayRecord:
    """Named arrays (or an ArrayRecord, returned as is) as an ArrayRecord, order kept."""
    if isinstance(arrays, ArrayRecord):
        return arrays
    return ArrayRecord(
        {k: Array.from_numpy_ndarray(np.ascontiguousarray(v)) for k, v in arrays.items()}
    )


def to_numpy(record: ArrayRecord | Mapping[str, npt.NDArray[Any]]) -> Arrays:
    """An ArrayRecord (or named arrays) as named numpy arrays, order kept."""
    if isinstance(record, ArrayRecord):
        return {k: v.numpy() for k, v in record.items()}
    return {k: np.asarray(v) for k, v in record.items()}


def write_npz(arrays: ArrayRecord | Mapping[str, npt.NDArray[Any]]) -> bytes:
    """Named arrays as .npz bytes (order kept). An ArrayRecord's arrays are read in place
    (views on their bytes), not copied first: a checkpoint of a large model costs the file's
    bytes, not one more model."""
    from workloads.sdk.aggregate import array_view  # aggregate imports Flower's strategies

    named = (
        {k: array_view(v) for k, v in arrays.items()}
        if isinstance(arrays, ArrayRecord)
        else {k: np.asarray(v) for k, v in arrays.items()}
    )
    buffer = io.BytesIO()
    np.savez(buffer, **named)  # type: ignore[arg-type]
    return buffer.getvalue()


def read_npz(data: bytes, name: str = "model.npz") -> ArrayRecord:
    """An .npz of named arrays (pickles refused)."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            return to_record({key: np.asarray(npz[key]) for key in npz.files})
    except (OSError, ValueError, EOFError) as exc:
        raise ModelFormatError(f"{name} is not an .npz of arrays: {exc}") from None


def write_arrayrecord(record: ArrayRecord | Mapping[str, npt.NDArray[Any]]) -> bytes:
    """A Flower ArrayRecord as its protobuf bytes (the ``.arrayrecord`` format)."""
    from flwr.common.serde import array_record_to_proto

    return bytes(array_record_to_proto(to_record(record)).SerializeToString())


def read_arrayrecord(data: bytes, name: str = "model.arrayrecord") -> ArrayRecord:
    """A Flower ArrayRecord from its protobuf bytes."""
    from flwr.common.serde import array_record_from_proto
    from flwr.proto.recorddict_pb2 import ArrayRecord as ProtoArrayRecord

    proto = ProtoArrayRecord()
    try:
        proto.ParseFromString(data)
        record = array_record_from_proto(proto)
        for value in record.values():
            value.numpy()  # checks dtype/shape/data agree
    except Exception as exc:
        raise ModelFormatError(f"{name} is not a Flower ArrayRecord: {exc}") from None
    if not record:
        raise ModelFormatError(f"{name} is not a Flower ArrayRecord: it holds no arrays")
    return record


def _state_dict_of(obj: Any, name: str) -> Mapping[str, Any]:
    import torch

    def tensors(value: Any) -> bool:
        return (
            isinstance(value, Mapping)
            and bool(value)
            and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in value.items())
        )

    if tensors(obj):
        return dict(obj)
    if isinstance(obj, Mapping):
        for key in STATE_DICT_KEYS:
            if tensors(obj.get(key)):
                return dict(obj[key])
    kind = type(obj).__name__
    raise ModelFormatError(
        f"{name} holds a {kind}, not a state_dict of tensors (or a dict with one under "
        f"{', '.join(STATE_DICT_KEYS)}): save it with torch.save(model.state_dict(), path)"
    )


def read_torch(data: bytes, name: str = "model.pth") -> ArrayRecord:
    """A torch state_dict (.pt/.pth), loaded with ``weights_only=True`` on the CPU."""
    import torch

    try:
        obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ModelFormatError(
            f"{name} cannot be loaded as weights (torch.load weights_only): {exc}"
        ) from None
    out: Arrays = {}
    for key, tensor in _state_dict_of(obj, name).items():
        try:
            out[key] = tensor.detach().cpu().numpy()
        except (TypeError, RuntimeError) as exc:
            raise ModelFormatError(f"{name}: tensor {key!r} has no numpy form: {exc}") from None
    return to_record(out)


def read_safetensors(data: bytes, name: str = "model.safetensors") -> ArrayRecord:
    """Tensors from a safetensors file (no torch needed)."""
    from safetensors.numpy import load

    try:
        arrays = load(data)
    except Exception as exc:
        raise ModelFormatError(f"{name} is not a safetensors file: {exc}") from None
    if not arrays:
        raise ModelFormatError(f"{name} holds no tensors")
    return to_record(arrays)


def write_safetensors(arrays: ArrayRecord | Mapping[str, npt.NDArray[Any]]) -> bytes:
    """Named arrays as safetensors bytes."""
    from safetensors.numpy import save

    return bytes(save(to_numpy(arrays)))


def read_model(data: bytes, name: str) -> ArrayRecord:
    """Read a model file by its suffix (see the module table)."""
    suffix = PurePath(name).suffix.lower()
    if suffix == ".npz":
        return read_npz(data, name)
    if suffix == ".arrayrecord":
        return read_arrayrecord(data, name)
    if suffix in (".pt", ".pth"):
        return read_torch(data, name)
    if suffix == ".safetensors":
        return read_safetensors(data, name)
    raise ModelFormatError(
        f"{name}: unknown model format {suffix or '(no suffix)'}; use one of {', '.join(SUFFIXES)}"
    )


def check_compatible(start: ArrayRecord, expected: ArrayRecord, source: str) -> None:
    """Raise ModelFormatError naming ``source`` and the first difference when ``start`` does
    not have exactly the names and shapes of ``expected`` (the app's own model)."""
    missing = [k for k in expected if k not in start]
    extra = [k for k in start if k not in expected]
    if missing or extra:
        raise ModelFormatError(
            f"{source} does not fit the app's model: missing {missing[:5]}, unexpected {extra[:5]}"
        )
    for key, array in expected.items():
        if list(start[key].shape) != list(array.shape):
            raise ModelFormatError(
                f"{source} does not fit the app's model: {key!r} has shape "
                f"{list(start[key].shape)}, the model wants {list(array.shape)}"
            )


def reorder(start: ArrayRecord, expected: ArrayRecord) -> ArrayRecord:
    """``start``'s arrays in ``expected``'s key order (files may order names differently)."""
    return ArrayRecord({k: start[k] for k in expected})
