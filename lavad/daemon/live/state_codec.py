"""A data-only codec for the engine's state: decoding a file never runs code it names.

Snapshots used to be pickles, and a pickle is a program: whoever can write the
snapshot directory (or, later, the snapshot topic) could make lavad call any
function. This codec writes the same object graph as data and reads it back
without ever calling anything the file chooses:

* Every object is written as a type name and its fields. On reading, the name
  is looked up in a registry built *by this process* before any file is read:
  the classes and functions defined in lavad's own modules (those whose
  ``__module__`` starts with ``lavad.``), plus a fixed list of builtin,
  ``collections`` and numpy types. A name outside the registry is an error; no
  module is imported and no attribute is looked up by a name from the file.
* An instance is created with ``object.__new__`` and its fields are set with
  ``object.__setattr__`` (slots) or written into its ``__dict__``: no
  ``__init__``, ``__setstate__``, ``__post_init__`` or property of the class
  runs. Field names are checked against the class's slots, and dunder names
  are refused, so a file cannot rebind ``__class__`` or ``__dict__``.
* numpy arrays are raw bytes with a dtype of a plain kind (bool, integer,
  float, complex, bytes, str, datetime); object and structured dtypes are
  refused both ways. Generators are rebuilt from their bit generator's
  ``state`` dictionary (the bit generator class comes from the registry).
* The structure is JSON (orjson). Non-finite floats, integers beyond 64 bits,
  tuples, sets, dicts with non-str keys, Counters, deques, defaultdicts,
  IntEnums and numpy scalars carry a tag so they come back as the same type.

Objects reached twice (the migration planner's lifetime view holds the same
tracker as the policy's hooks) are written once and referenced after, so
identity and cycles survive the round trip.

Saving is as strict as loading: an object of a type outside the registry, or
a function that is not a lavad module-level function (a lambda, a closure, a
bound method), fails the save with the path to it, rather than writing a
snapshot that could not be read back.
"""

from __future__ import annotations

import collections
import enum
import math
import pkgutil
import struct
import threading
import types
from collections.abc import Callable, Iterator
from functools import cache
from importlib import import_module
from typing import Any, Final

import numpy as np
import orjson

import lavad

# Offline studies, plots and the command line are never engine state; walking
# them would import matplotlib and river into the daemon for nothing (and a
# __main__ would run).
_SKIPPED_MODULES: Final = frozenset({"evaluation", "cli", "report", "demo", "__main__"})

# Array dtypes kinds that are plain data: bool, signed/unsigned int, float,
# complex, bytes, unicode, datetime, timedelta. Never "O" (objects) or "V".
_PLAIN_KINDS: Final = frozenset("biufcSUmM")

_I64_MIN: Final = -(2**63)
_U64_MAX: Final = 2**64 - 1

# The type of a function's values in a class's __dict__ (staticmethod etc.
# are never engine state); plain module-level functions only.
_FUNCTION_TYPES: Final = (types.FunctionType, types.BuiltinFunctionType)

_BUILTIN_TYPES: Final[dict[str, type]] = {
    "builtins.int": int,
    "builtins.float": float,
    "builtins.str": str,
    "builtins.bool": bool,
    "builtins.list": list,
    "builtins.dict": dict,
    "builtins.set": set,
    "builtins.tuple": tuple,
    "builtins.frozenset": frozenset,
}

_BIT_GENERATORS: Final[dict[str, type[np.random.BitGenerator]]] = {
    f"numpy.random.{cls.__name__}": cls
    for cls in (
        np.random.PCG64,
        np.random.PCG64DXSM,
        np.random.Philox,
        np.random.SFC64,
        np.random.MT19937,
    )
}


class StateCodecError(Exception):
    """The state cannot be written, or a file cannot be read back, as data.

    On a save, ``path`` leads from the saved value to the refused object.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.path: list[str] = []

    def __str__(self) -> str:
        if not self.path:
            return self.reason
        return f"state{''.join(self.path)}: {self.reason}"


class Registry:
    """Names <-> the classes and functions a state file may mention."""

    def __init__(self, classes: dict[str, type], functions: dict[str, Callable[..., Any]]) -> None:
        self.classes = classes
        self.functions = functions
        self._class_names = {cls: name for name, cls in classes.items()}
        self._function_names = {id(fn): name for name, fn in functions.items()}
        self._fields: dict[type, tuple[tuple[str, ...], bool]] = {}

    def class_name(self, cls: type) -> str | None:
        return self._class_names.get(cls)

    def function_name(self, fn: object) -> str | None:
        name = self._function_names.get(id(fn))
        return name if name is not None and self.functions[name] is fn else None

    def layout(self, cls: type) -> tuple[tuple[str, ...], bool]:
        """The class's slot names (mangled as stored) and whether instances have a __dict__."""
        cached = self._fields.get(cls)
        if cached is None:
            slots: list[str] = []
            has_dict = False
            for klass in cls.__mro__:
                if klass is object:
                    continue
                declared = klass.__dict__.get("__slots__")
                if declared is None:
                    has_dict = True  # a class in the chain without __slots__
                    continue
                for slot in (declared,) if isinstance(declared, str) else declared:
                    if slot == "__dict__":
                        has_dict = True
                    elif slot != "__weakref__":
                        slots.append(_mangle(klass, slot))
            cached = (tuple(dict.fromkeys(slots)), has_dict)
            self._fields[cls] = cached
        return cached


def _mangle(klass: type, slot: str) -> str:
    if slot.startswith("__") and not slot.endswith("__"):
        return f"_{klass.__name__.lstrip('_')}{slot}"
    return slot


# The daemon walks the packages in a thread while it joins its group; a
# snapshot taken or loaded meanwhile waits for that walk instead of making
# its own.
_REGISTRY_LOCK: Final = threading.Lock()


def default_registry() -> Registry:
    """lavad's own classes and functions, found by walking its packages (once per process,
    whichever thread asks first; the others wait for it)."""
    with _REGISTRY_LOCK:
        return _walked_registry()


@cache
def _walked_registry() -> Registry:
    classes: dict[str, type] = dict(_BUILTIN_TYPES)
    functions: dict[str, Callable[..., Any]] = {}
    for info in pkgutil.walk_packages(lavad.__path__, "lavad."):
        if not _SKIPPED_MODULES.isdisjoint(info.name.split(".")):
            continue
        module = import_module(info.name)  # our own module, named by our own package
        for value in vars(module).values():
            owner = getattr(value, "__module__", None)
            if not isinstance(owner, str) or not owner.startswith("lavad."):
                continue
            qualname = getattr(value, "__qualname__", "")
            if "<" in qualname:  # lambdas and locals: not addressable by name
                continue
            name = f"{owner}.{qualname}"
            if isinstance(value, type):
                classes[name] = value
                for nested in _nested_classes(value):
                    classes[f"{owner}.{nested.__qualname__}"] = nested
            elif isinstance(value, _FUNCTION_TYPES):
                functions[name] = value
    return Registry(classes, functions)


def _nested_classes(cls: type) -> Iterator[type]:
    for value in vars(cls).values():
        if isinstance(value, type) and value.__module__ == cls.__module__:
            yield value
            yield from _nested_classes(value)


# ---------------------------------------------------------------- encoding
#
# Plain JSON values stand for themselves: None, bool, str, int (64-bit),
# finite float. Everything else is a JSON array whose first item is a tag:
#   ["f", "inf"|"-inf"|"nan"]          non-finite float
#   ["I", "123..."]                    integer beyond 64 bits
#   ["t", [items]] / ["F", [items]]    tuple / frozenset
#   ["r", n]                           the n-th object already written (shared)
# and, for objects that may be shared (each takes the next number when written):
#   ["l", [items]]  ["s", [items]]  ["D", {str: value}]  ["d", [k, v, k, v, ...]]
#   ["C", [k, v, ...]] Counter  ["Q", maxlen, [items]] deque
#   ["dd", factory, [k, v, ...]] defaultdict  ["od", [k, v, ...]] OrderedDict
#   ["a", dtype, shape, offset, nbytes] array (bytes in the blob after the JSON)
#   ["g", bit generator, state] Generator  ["B", bit generator, state] BitGenerator
#   ["o", class, {field: value}] object   ["e", class, value] enum member
# and, never shared: ["n", dtype, hex] numpy scalar, ["T", class] a class,
# ["fn", function] a lavad function, ["b", hex] bytes.


class _Encoder:
    """Writes the tree; paths to a refused object are built only when one is refused."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.memo: dict[int, int] = {}
        # Keeps every memoised object alive, so an id() is never reused mid-save.
        self.keep: list[object] = []
        self.blob: list[bytes] = []
        self.offset = 0

    def _share(self, value: object) -> int | None:
        """The number of ``value`` if already written; else number it now."""
        key = id(value)
        seen = self.memo.get(key)
        if seen is not None:
            return seen
        self.memo[key] = len(self.memo)
        self.keep.append(value)
        return None

    def encode(self, value: Any) -> Any:
        kind = type(value)
        if value is None or kind is bool or kind is str:
            return value
        if kind is int:
            return value if _I64_MIN <= value <= _U64_MAX else ["I", str(value)]
        if kind is float:
            return value if math.isfinite(value) else ["f", repr(value)]
        if kind is tuple:
            return ["t", self._items(value)]
        if kind is frozenset:
            return ["F", self._items(value)]
        if isinstance(value, np.generic):
            return self._scalar(value)
        if isinstance(value, type):
            name = self.registry.class_name(value)
            if name is None:
                raise StateCodecError(f"class {_qualified(value)} is not a lavad type")
            return ["T", name]
        if isinstance(value, _FUNCTION_TYPES):
            name = self.registry.function_name(value)
            if name is None:
                raise StateCodecError(
                    f"function {_qualified(value)} is not a module-level lavad function "
                    "(lambdas, closures and bound methods cannot be saved as data)"
                )
            return ["fn", name]
        if kind is bytes:
            return ["b", value.hex()]
        seen = self._share(value)
        if seen is not None:
            return ["r", seen]
        if kind is list:
            return ["l", self._items(value)]
        if kind is dict:
            if all(type(k) is str for k in value):
                return ["D", self._str_keyed(value)]
            return ["d", self._pairs(value)]
        if kind is set:
            return ["s", self._items(value)]
        if kind is collections.Counter:
            return ["C", self._pairs(value)]
        if kind is collections.deque:
            return ["Q", value.maxlen, self._items(value)]
        if kind is collections.defaultdict:
            factory = self._at(".default_factory", value.default_factory)
            return ["dd", factory, self._pairs(value)]
        if kind is collections.OrderedDict:
            return ["od", self._pairs(value)]
        if kind is np.ndarray:
            return self._array(value)
        if kind is np.random.Generator:
            return ["g", *self._bit_generator(value.bit_generator)]
        if isinstance(value, np.random.BitGenerator):
            return ["B", *self._bit_generator(value)]
        name = self.registry.class_name(kind)
        if name is None:
            raise StateCodecError(
                f"{_qualified(kind)} is not a lavad type or a plain container; "
                "snapshots hold data only"
            )
        if isinstance(value, enum.Enum):
            return ["e", name, self._at(".value", value.value)]
        return ["o", name, self._fields(value, kind)]

    def _at(self, segment: str, value: Any) -> Any:
        try:
            return self.encode(value)
        except StateCodecError as exc:
            exc.path.insert(0, segment)
            raise

    def _items(self, values: Any) -> list[Any]:
        out: list[Any] = []
        encode = self.encode
        try:
            for item in values:
                out.append(encode(item))
        except StateCodecError as exc:
            exc.path.insert(0, f"[{len(out)}]")
            raise
        return out

    def _str_keyed(self, mapping: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        encode = self.encode
        key = ""
        try:
            for key, item in mapping.items():
                out[key] = encode(item)
        except StateCodecError as exc:
            exc.path.insert(0, f"[{key!r}]")
            raise
        return out

    def _pairs(self, mapping: Any) -> list[Any]:
        out: list[Any] = []
        encode = self.encode
        key: Any = None
        try:
            for key, item in mapping.items():
                out.append(encode(key))
                out.append(encode(item))
        except StateCodecError as exc:
            exc.path.insert(0, f"[{key!r}]")
            raise
        return out

    def _fields(self, value: object, kind: type) -> dict[str, Any]:
        slots, has_dict = self.registry.layout(kind)
        fields: dict[str, Any] = {}
        for name in slots:
            try:
                item = object.__getattribute__(value, name)
            except AttributeError:
                continue  # an unset slot stays unset
            fields[name] = self._at(f".{name}", item)
        if has_dict:
            for name, item in vars(value).items():
                fields[name] = self._at(f".{name}", item)
        return fields

    def _scalar(self, value: np.generic) -> list[Any]:
        dtype = value.dtype
        if dtype.kind not in _PLAIN_KINDS or dtype.fields is not None:
            raise StateCodecError(f"numpy scalar of dtype {dtype} is not plain data")
        return ["n", dtype.str, value.tobytes().hex()]

    def _array(self, value: np.ndarray[Any, Any]) -> list[Any]:
        dtype = value.dtype
        if dtype.kind not in _PLAIN_KINDS or dtype.fields is not None:
            raise StateCodecError(f"array of dtype {dtype} is not plain data")
        raw = np.ascontiguousarray(value).tobytes()
        entry = ["a", dtype.str, list(value.shape), self.offset, len(raw)]
        self.blob.append(raw)
        self.offset += len(raw)
        return entry

    def _bit_generator(self, bits: np.random.BitGenerator) -> list[Any]:
        name = f"numpy.random.{type(bits).__name__}"
        if _BIT_GENERATORS.get(name) is not type(bits):
            raise StateCodecError(f"bit generator {_qualified(type(bits))} is not known")
        return [name, self._at(".state", bits.state)]


def _qualified(value: Any) -> str:
    return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', type(value))}"


# ---------------------------------------------------------------- decoding


class _Decoder:
    def __init__(self, registry: Registry, blob: memoryview) -> None:
        self.registry = registry
        self.blob = blob
        self.memo: list[Any] = []
        # Objects whose class checks itself once restored (``check_restored``,
        # raising ValueError), e.g. state that compiled code indexes without
        # bounds checks; run when the whole tree is read, so that references
        # between objects are complete.
        self.to_check: list[Any] = []

    def decode(self, node: Any) -> Any:
        if not isinstance(node, list):
            if isinstance(node, dict):
                raise StateCodecError("a JSON object where a value was expected")
            return node  # None, bool, int, float, str
        if not node or not isinstance(node[0], str):
            raise StateCodecError("a value without a tag")
        tag = node[0]
        if tag == "f":
            text = self._arg(node, 1, str)
            if text not in ("inf", "-inf", "nan"):
                raise StateCodecError(f"float {text!r} is not a non-finite float")
            return float(text)
        if tag == "I":
            return int(self._arg(node, 1, str))
        if tag == "t":
            return tuple(self.decode(v) for v in self._arg(node, 1, list))
        if tag == "F":
            return frozenset(self.decode(v) for v in self._arg(node, 1, list))
        if tag == "b":
            return _hex(self._arg(node, 1, str))
        if tag == "n":
            dtype = _plain_dtype(self._arg(node, 1, str))
            raw = _hex(self._arg(node, 2, str))
            if len(raw) != dtype.itemsize:
                raise StateCodecError(f"numpy scalar of {len(raw)} bytes for dtype {dtype}")
            return np.frombuffer(raw, dtype=dtype)[0]
        if tag == "T":
            return self._class(self._arg(node, 1, str))
        if tag == "fn":
            name = self._arg(node, 1, str)
            function = self.registry.functions.get(name)
            if function is None:
                raise StateCodecError(f"function {name!r} is not a lavad function")
            return function
        if tag == "r":
            index = self._arg(node, 1, int)
            if not 0 <= index < len(self.memo):
                raise StateCodecError(f"reference {index} to an object not yet read")
            return self.memo[index]
        return self._shared(tag, node)

    def _shared(self, tag: str, node: list[Any]) -> Any:
        # Each object is numbered before its contents are read (as when
        # written), so a reference inside it to itself resolves.
        if tag == "l":
            out_list: list[Any] = []
            self.memo.append(out_list)
            out_list.extend(self.decode(v) for v in self._arg(node, 1, list))
            return out_list
        if tag == "D":
            out_dict: dict[str, Any] = {}
            self.memo.append(out_dict)
            for key, item in self._arg(node, 1, dict).items():
                out_dict[key] = self.decode(item)
            return out_dict
        if tag == "d":
            pairs: dict[Any, Any] = {}
            self.memo.append(pairs)
            self._fill(pairs, self._arg(node, 1, list))
            return pairs
        if tag == "s":
            out_set: set[Any] = set()
            self.memo.append(out_set)
            out_set.update(self.decode(v) for v in self._arg(node, 1, list))
            return out_set
        if tag == "C":
            counter: collections.Counter[Any] = collections.Counter()
            self.memo.append(counter)
            self._fill(counter, self._arg(node, 1, list))
            return counter
        if tag == "Q":
            maxlen = node[1] if len(node) > 1 else None
            if maxlen is not None and (type(maxlen) is not int or maxlen < 0):
                raise StateCodecError(f"deque maxlen {maxlen!r}")
            queue: collections.deque[Any] = collections.deque(maxlen=maxlen)
            self.memo.append(queue)
            queue.extend(self.decode(v) for v in self._arg(node, 2, list))
            return queue
        if tag == "dd":
            defaults: collections.defaultdict[Any, Any] = collections.defaultdict()
            self.memo.append(defaults)
            factory = self.decode(node[1] if len(node) > 1 else None)
            if factory is not None and not isinstance(factory, (type, *_FUNCTION_TYPES)):
                raise StateCodecError("defaultdict factory is not a class or a lavad function")
            defaults.default_factory = factory
            self._fill(defaults, self._arg(node, 2, list))
            return defaults
        if tag == "od":
            ordered: collections.OrderedDict[Any, Any] = collections.OrderedDict()
            self.memo.append(ordered)
            self._fill(ordered, self._arg(node, 1, list))
            return ordered
        if tag == "a":
            array = self._array(node)
            self.memo.append(array)
            return array
        if tag in ("g", "B"):
            index = len(self.memo)
            self.memo.append(None)
            bits = self._bit_generator(node)
            value: Any = np.random.Generator(bits) if tag == "g" else bits
            self.memo[index] = value
            return value
        if tag == "o":
            return self._object(node)
        if tag == "e":
            cls = self._class(self._arg(node, 1, str))
            if not issubclass(cls, enum.Enum):
                raise StateCodecError(f"{cls.__qualname__} is not an enum")
            index = len(self.memo)
            self.memo.append(None)
            member = cls(self.decode(node[2] if len(node) > 2 else None))  # a lookup, not a call
            self.memo[index] = member
            return member
        raise StateCodecError(f"unknown tag {tag!r}")

    def _fill(self, mapping: Any, flat: list[Any]) -> None:
        if len(flat) % 2:
            raise StateCodecError("a mapping with an odd number of keys and values")
        for i in range(0, len(flat), 2):
            key = self.decode(flat[i])
            mapping[key] = self.decode(flat[i + 1])

    def _class(self, name: str) -> type:
        cls = self.registry.classes.get(name)
        if cls is None:
            raise StateCodecError(f"type {name!r} is not an allowed lavad type")
        return cls

    def _object(self, node: list[Any]) -> Any:
        name = self._arg(node, 1, str)
        cls = self._class(name)
        if name in _BUILTIN_TYPES or issubclass(cls, enum.Enum | BaseException):
            raise StateCodecError(f"type {name!r} cannot be rebuilt field by field")
        fields = self._arg(node, 2, dict)
        instance = object.__new__(cls)
        self.memo.append(instance)
        slots, has_dict = self.registry.layout(cls)
        allowed = set(slots)
        namespace = instance.__dict__ if has_dict else None
        for field_name, item in fields.items():
            if field_name.startswith("__") or not field_name.isidentifier():
                raise StateCodecError(f"{name}: field name {field_name!r} refused")
            value = self.decode(item)
            if field_name in allowed:
                object.__setattr__(instance, field_name, value)
            elif namespace is not None:
                namespace[field_name] = value
            else:
                raise StateCodecError(f"{name} has no field {field_name!r}")
        if callable(getattr(cls, "check_restored", None)):
            self.to_check.append(instance)
        return instance

    def _array(self, node: list[Any]) -> np.ndarray[Any, Any]:
        dtype = _plain_dtype(self._arg(node, 1, str))
        shape = self._arg(node, 2, list)
        offset, nbytes = self._arg(node, 3, int), self._arg(node, 4, int)
        if not all(type(n) is int and n >= 0 for n in shape):
            raise StateCodecError(f"array shape {shape!r}")
        if offset < 0 or nbytes != math.prod(shape) * dtype.itemsize:
            raise StateCodecError("array size does not match its shape and dtype")
        if offset + nbytes > len(self.blob):
            raise StateCodecError("array bytes past the end of the file")
        flat = np.frombuffer(self.blob[offset : offset + nbytes], dtype=dtype)
        return flat.reshape(shape).copy()  # its own writable memory, like the saved one

    def _bit_generator(self, node: list[Any]) -> np.random.BitGenerator:
        name = self._arg(node, 1, str)
        cls = _BIT_GENERATORS.get(name)
        if cls is None:
            raise StateCodecError(f"bit generator {name!r} is not allowed")
        state = self.decode(node[2] if len(node) > 2 else None)
        if not isinstance(state, dict):
            raise StateCodecError(f"{name}: state is not a mapping")
        bits = cls()
        try:
            bits.state = state  # numpy validates the state's shape and types
        except (TypeError, ValueError, KeyError) as exc:
            raise StateCodecError(f"{name}: state refused ({exc})") from None
        return bits

    @staticmethod
    def _arg(node: list[Any], index: int, kind: type) -> Any:
        value = node[index] if len(node) > index else None
        if type(value) is not kind:
            raise StateCodecError(f"{node[0]!r}: item {index} is not a {kind.__name__}")
        return value


def _hex(text: str) -> bytes:
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise StateCodecError("bytes that are not hexadecimal") from None


def _plain_dtype(text: str) -> np.dtype[Any]:
    try:
        dtype = np.dtype(text)
    except TypeError:
        raise StateCodecError(f"dtype {text!r} is not a dtype") from None
    if dtype.kind not in _PLAIN_KINDS or dtype.fields is not None or dtype.str != text:
        raise StateCodecError(f"dtype {text!r} is not plain data")
    return dtype


# ------------------------------------------------------------------ framing

_LENGTH: Final = struct.Struct("<Q")


def dumps(value: object, registry: Registry | None = None) -> bytes:
    """The state as bytes: the JSON structure's length, the structure, then the array bytes."""
    encoder = _Encoder(registry or default_registry())
    tree = encoder.encode(value)
    try:
        structure = orjson.dumps(tree)
    except TypeError as exc:  # a value the encoder let through unchanged
        raise StateCodecError(f"state: {exc}") from None
    return b"".join([_LENGTH.pack(len(structure)), structure, *encoder.blob])


def loads(data: bytes, registry: Registry | None = None) -> Any:
    """The state ``dumps`` wrote; StateCodecError when the bytes are not such a state."""
    if len(data) < _LENGTH.size:
        raise StateCodecError("shorter than its length prefix")
    (length,) = _LENGTH.unpack_from(data)
    end = _LENGTH.size + length
    if end > len(data):
        raise StateCodecError("structure runs past the end of the data (truncated?)")
    try:
        tree = orjson.loads(data[_LENGTH.size : end])
    except orjson.JSONDecodeError as exc:
        raise StateCodecError(f"structure is not JSON ({exc})") from None
    decoder = _Decoder(registry or default_registry(), memoryview(data)[end:])
    try:
        state = decoder.decode(tree)
    except RecursionError:
        raise StateCodecError("structure nested too deeply") from None
    except (TypeError, ValueError) as exc:
        # e.g. an unhashable dict key, an enum value the class does not have
        raise StateCodecError(f"structure does not describe a state ({exc})") from None
    for instance in decoder.to_check:
        try:
            instance.check_restored()
        except ValueError as exc:
            name = type(instance).__qualname__
            raise StateCodecError(f"a restored {name} is inconsistent: {exc}") from None
    return state
