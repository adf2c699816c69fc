"""Set ``output_to_operand_aliasing`` on a custom call inside a serialized ``HloModuleProto``.

torch_xla's ``_xla_custom_call`` cannot declare that a custom call's output is one of its
operands, and re-parsing edited HLO text gives a module that torch_xla's builder refuses
(its ids are renumbered). So the alias is added where XLA keeps it, in the protobuf bytes:
``HloModuleProto.computations`` (field 3) → ``HloComputationProto.instructions`` (field 2)
→ the ``HloInstructionProto`` whose ``custom_call_target`` (field 28) is the target gets
one ``output_operand_aliasing`` entry (field 74: ``OutputOperandAliasing`` with
``output_shape_index`` = 1, ``operand_index`` = 2, ``operand_shape_index`` = 3) per alias.
Every other byte is kept as it was. Only the protobuf wire format is needed (no protobuf
package, no compiled XLA protos).

Example:
    >>> instruction = _encode([(28, 2, b"my.target")])
    >>> module = _encode([(3, 2, _encode([(2, 2, instruction)]))])
    >>> edited = add_operand_aliasing(module, "my.target", {2: 0}, tuple_output=True)
    >>> computation = _decode(_decode(edited)[0][2])
    >>> [(f, v) for f, _, v in _decode(computation[0][2])]
    [(28, b'my.target'), (74, b'\\n\\x01\\x00\\x10\\x02')]
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["add_operand_aliasing"]

_MODULE_COMPUTATIONS = 3
_COMPUTATION_INSTRUCTIONS = 2
_INSTRUCTION_CUSTOM_CALL_TARGET = 28
_INSTRUCTION_OUTPUT_OPERAND_ALIASING = 74
_ALIAS_OUTPUT_SHAPE_INDEX, _ALIAS_OPERAND_INDEX = 1, 2

_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5

Field = tuple[int, int, int | bytes]       # (field number, wire type, value)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _decode(data: bytes) -> list[Field]:
    """The fields of one message, in order (values of nested messages left as bytes)."""
    fields: list[Field] = []
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, pos = _read_varint(data, pos)
            fields.append((number, wire, value))
        elif wire == _BYTES:
            size, pos = _read_varint(data, pos)
            fields.append((number, wire, data[pos:pos + size]))
            pos += size
        elif wire in (_FIXED64, _FIXED32):
            size = 8 if wire == _FIXED64 else 4
            fields.append((number, wire, data[pos:pos + size]))
            pos += size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire} (field {number})")
    return fields


def _encode(fields: list[Field]) -> bytes:
    out = bytearray()
    for number, wire, value in fields:
        out += _varint(number << 3 | wire)
        if wire == _VARINT:
            out += _varint(int(value))
        elif wire == _BYTES:
            out += _varint(len(value)) + bytes(value)
        else:
            out += bytes(value)
    return bytes(out)


def _alias_entry(output: int, operand: int, tuple_output: bool) -> bytes:
    """An ``OutputOperandAliasing``: output ``{output}`` (``{}`` for an array result) is
    operand ``operand`` (the whole operand)."""
    fields: list[Field] = []
    if tuple_output:
        fields.append((_ALIAS_OUTPUT_SHAPE_INDEX, _BYTES, _varint(output)))   # packed [output]
    if operand:
        fields.append((_ALIAS_OPERAND_INDEX, _VARINT, operand))
    return _encode(fields)


def add_operand_aliasing(module: bytes, target: str, aliases: Mapping[int, int], *,
                         tuple_output: bool) -> bytes:
    """``module`` with ``aliases`` (``{operand index: output index}``) declared on its only
    custom call of ``target``; ``tuple_output`` when the call returns a tuple (the output
    index is then its tuple index).

    Raises ValueError unless exactly one custom call of ``target`` is in the module.
    """
    name = target.encode()
    found = 0
    computations = []
    for number, wire, value in _decode(module):
        if number == _MODULE_COMPUTATIONS and wire == _BYTES:
            instructions = []
            for n, w, v in _decode(value):
                if n == _COMPUTATION_INSTRUCTIONS and w == _BYTES:
                    fields = _decode(v)
                    if (_INSTRUCTION_CUSTOM_CALL_TARGET, _BYTES, name) in fields:
                        found += 1
                        fields += [(_INSTRUCTION_OUTPUT_OPERAND_ALIASING, _BYTES,
                                    _alias_entry(out, arg, tuple_output))
                                   for arg, out in sorted(aliases.items())]
                        v = _encode(fields)
                instructions.append((n, w, v))
            value = _encode(instructions)
        computations.append((number, wire, value))
    if found != 1:
        raise ValueError(f"expected one custom call of {target!r} in the module, found {found}")
    return _encode(computations)
