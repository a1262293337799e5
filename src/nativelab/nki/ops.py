"""The math operators of NKI (`nl.add`, `nl.exp`, ...): each is both an `op=` argument of an nki.isa
instruction and a callable nki.language function. Engines compute in fp32 (the NKI ISA pages: "The Scalar
Engine always performs math in float32 precision"; Vector Engine "all computation is still done in FP32"),
so an operator's torch implementation receives fp32 tensors (integer tensors stay integers for the bitwise
operators) and the instruction rounds the result once, to its destination's dtype."""

from __future__ import annotations

import math

import torch


_call: list = [None]  # nki.language.apply_op (bound by nki.language, which sits above this module)


def bind_call(fn) -> None:
    _call[0] = fn


class Op:
    """One operator: `name`, how many operands, its torch implementation, and, for reductions, the torch
    reduction it is (add -> sum)."""

    def __init__(self, name: str, arity: int, fn, reduce=None, integer: bool = False, identity=None):
        self.name, self.arity, self.fn, self.reduce_fn, self.integer = name, arity, fn, reduce, integer
        self.identity = identity

    def __repr__(self):
        return f"nl.{self.name}"

    def apply(self, *xs):
        return self.fn(*xs)

    def __call__(self, *args, **kwargs):
        return _call[0](self, *args, **kwargs)


def _with_scalar(fn, bound: str, x, y):
    """torch.maximum / minimum with a scalar operand (tensor_scalar's immediate): a clamp, NaN kept."""
    if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
        return fn(x, y)
    t, v = (x, y) if isinstance(x, torch.Tensor) else (y, x)
    return torch.clamp(t, **{bound: v})


def _gelu_tanh(x):
    return torch.nn.functional.gelu(x, approximate="tanh")


def _gelu_sigmoid(x):  # x * sigmoid(1.702 x), the sigmoid approximation of GELU
    return x * torch.sigmoid(1.702 * x)


def _gelu_dx(x):  # d/dx x * Phi(x) = Phi(x) + x * phi(x)
    return 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0))) + x * torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def _gelu_sigmoid_dx(x):  # d/dx x * sigmoid(1.702 x)
    s = torch.sigmoid(1.702 * x)
    return s + 1.702 * x * s * (1.0 - s)


def _silu_dx(x):  # d/dx x * sigmoid(x)
    s = torch.sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


def _unary(name, fn):
    return Op(name, 1, fn)


UNARY = [
    _unary("exp", torch.exp), _unary("log", torch.log), _unary("sqrt", torch.sqrt), _unary("rsqrt", torch.rsqrt),
    _unary("reciprocal", torch.reciprocal), _unary("tanh", torch.tanh), _unary("sigmoid", torch.sigmoid),
    _unary("relu", torch.relu), _unary("gelu", torch.nn.functional.gelu), _unary("gelu_apprx_tanh", _gelu_tanh),
    _unary("gelu_apprx_sigmoid", _gelu_sigmoid), _unary("silu", torch.nn.functional.silu),
    _unary("softplus", torch.nn.functional.softplus), _unary("mish", torch.nn.functional.mish),
    _unary("square", torch.square), _unary("abs", torch.abs), _unary("negative", torch.neg),
    _unary("sign", torch.sign), _unary("sin", torch.sin), _unary("cos", torch.cos), _unary("tan", torch.tan),
    _unary("arctan", torch.atan), _unary("erf", torch.erf), _unary("floor", torch.floor),
    _unary("ceil", torch.ceil), _unary("trunc", torch.trunc), _unary("copy", lambda x: x),
    _unary("identity", lambda x: x), _unary("bypass", lambda x: x),
    _unary("erf_dx", lambda x: 2.0 / math.sqrt(math.pi) * torch.exp(-x * x)),
    _unary("logical_not", torch.logical_not), _unary("gelu_dx", _gelu_dx),
    _unary("gelu_apprx_sigmoid_dx", _gelu_sigmoid_dx), _unary("silu_dx", _silu_dx),
    _unary("prelu", torch.relu),  # its slope is activate2's relu_param (NeuronCore-v4); 0 elsewhere
    Op("invert", 1, torch.bitwise_not, integer=True),
]

BINARY = [
    Op("add", 2, torch.add, reduce=torch.sum, identity=0.0),
    Op("subtract", 2, torch.sub),
    Op("multiply", 2, torch.mul, reduce=torch.prod, identity=1.0),
    Op("divide", 2, torch.div),
    Op("maximum", 2, lambda x, y: _with_scalar(torch.maximum, "min", x, y), reduce=torch.amax, identity=-math.inf),
    Op("minimum", 2, lambda x, y: _with_scalar(torch.minimum, "max", x, y), reduce=torch.amin, identity=math.inf),
    Op("average", 2, lambda a, b: (a + b) * 0.5, reduce=torch.mean),
    Op("power", 2, torch.pow),
    Op("mod", 2, torch.remainder),
    Op("fmod", 2, torch.fmod),
    Op("equal", 2, lambda a, b: torch.eq(a, b).float()),
    Op("not_equal", 2, lambda a, b: torch.ne(a, b).float()),
    Op("less", 2, lambda a, b: torch.lt(a, b).float()),
    Op("less_equal", 2, lambda a, b: torch.le(a, b).float()),
    Op("greater", 2, lambda a, b: torch.gt(a, b).float()),
    Op("greater_equal", 2, lambda a, b: torch.ge(a, b).float()),
    Op("logical_and", 2, lambda a, b: torch.logical_and(a, b).float()),
    Op("logical_or", 2, lambda a, b: torch.logical_or(a, b).float()),
    Op("logical_xor", 2, lambda a, b: torch.logical_xor(a, b).float()),
    Op("bitwise_and", 2, torch.bitwise_and, integer=True),
    Op("bitwise_or", 2, torch.bitwise_or, integer=True),
    Op("bitwise_xor", 2, torch.bitwise_xor, integer=True),
    Op("left_shift", 2, torch.bitwise_left_shift, integer=True),
    Op("right_shift", 2, torch.bitwise_right_shift, integer=True),
]

ALL = {op.name: op for op in UNARY + BINARY}
ALL["max"] = ALL["maximum"]  # the names NKI also accepts as reduce ops
ALL["min"] = ALL["minimum"]
ALL["mult"] = ALL["multiply"]
ALL["multiply"].reduce_fn = torch.prod


def as_op(op) -> Op:
    """An nl operator, or the numpy ufunc / name / nki.language function it stands for."""
    if isinstance(op, Op):
        return op
    name = getattr(op, "__name__", op if isinstance(op, str) else None)
    aliases = {"sum": "add", "amax": "maximum", "amin": "minimum", "prod": "multiply", "true_divide": "divide",
               "mul": "multiply", "sub": "subtract", "max": "maximum", "min": "minimum"}
    name = aliases.get(name, name)
    if name in ALL:
        return ALL[name]
    raise ValueError(f"nki: {op!r} is not an NKI operator (nl.add, nl.multiply, nl.exp, ...)")
