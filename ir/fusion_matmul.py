"""Recognizing a linear function of a matmul that only it reads (ir/fusion.py's `MatmulUpdate`
kernels): `w - lr * (x^T @ g)`, the SGD update of a gradient used for nothing else, becomes one
gemm that adds into the rest of the expression, so the gradient never reaches memory."""
from __future__ import annotations


from tracer.ir.graph import Instruction, Value
from tracer.ir.types import FLOAT_DTYPES


class MatmulUpdate:
    """result = rest + alpha * matmul(a, b), where `rest` is the result's expression with the
    matmul's value replaced by zero and alpha the product of the 0-d `factors` (and `sign`): the
    kernel stores `rest` into the result, then one gemm adds alpha * a @ b to it (beta = 1), so the
    matmul's value is never stored. (A plain class: @dataclass generating its methods took ~1 ms
    of every fresh process's tr.trace.)"""

    def __init__(self, matmul: Instruction, factors: list[Value], sign: int,
                 rest_is: Value | None):
        self.matmul = matmul
        self.factors = factors
        self.sign = sign
        self.rest_is = rest_is  # the parameter `rest` is equal to, if it is just one (no loop)


def matmul_update(value: Value, users: dict[int, list[Instruction]], materialized: set[int],
                  outputs: set[int]) -> MatmulUpdate | None:
    """`value` as rest + alpha * matmul(a, b) (see MatmulUpdate), if it is one: a chain of add, sub,
    neg and multiplications by 0-d values of the value's shape and float dtype down to a matmul
    whose result, like every value between, has no other reader and is no output."""
    def descend(v: Value, top: bool):
        instruction = v.producer
        if instruction is None or v.dtype not in FLOAT_DTYPES:
            return None
        if not top:
            if len(users.get(id(v), [])) != 1 or id(v) in outputs:
                return None
            if instruction.primitive == "matmul":
                return instruction, [], 1, True
            if id(v) in materialized:
                return None
        primitive, inputs = instruction.primitive, instruction.inputs
        if primitive == "neg":
            found = descend(inputs[0], False) if inputs[0].shape == v.shape else None
            return found and (found[0], found[1], -found[2], found[3])
        if primitive == "mul":
            for k in (0, 1):
                scalar, operand = inputs[1 - k], inputs[k]
                if scalar.type.ndim == 0 and operand.shape == v.shape and operand is not scalar:
                    found = descend(operand, False)
                    if found:
                        return found[0], [*found[1], scalar], found[2], found[3]
            return None
        if primitive in ("add", "sub"):
            for k in (0, 1):
                if inputs[k].shape != v.shape or inputs[0] is inputs[1]:
                    continue
                found = descend(inputs[k], False)
                if found:
                    sign = -found[2] if primitive == "sub" and k == 1 else found[2]
                    return found[0], found[1], sign, False
        return None

    if value.producer is None or value.producer.primitive not in ("add", "sub", "mul", "neg"):
        return None
    found = descend(value, True)
    if found is None:
        return None
    matmul, factors, sign, _ = found
    rest_is = None
    instruction = value.producer
    if instruction.primitive in ("add", "sub"):
        # rest is exactly a parameter when the other operand is one, taken with sign +1, and the
        # chain below adds nothing else
        k = 0 if descend(instruction.inputs[1], False) else 1
        other = instruction.inputs[k]
        below = descend(instruction.inputs[1 - k], False)
        if (other.producer is None and other.type == value.type and below and below[3]
                and (instruction.primitive == "add" or k == 0)):
            rest_is = other
    return MatmulUpdate(matmul, factors, sign, rest_is)
