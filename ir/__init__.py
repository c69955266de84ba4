"""The SSA intermediate representation: types, graph, primitives and their tables, passes."""
from tracer.ir.builder import ArrayBuilder, Builder, GraphBuilder
from tracer.ir.graph import Graph, Instruction, Value
from tracer.ir.interpreter import interpret
from tracer.ir.passes import cse, dce, fold_constants, optimize, simplify
from tracer.ir.primitives import DIRECTIVES, PRIMITIVES, SHAPE_RULES, ShapeError, infer_types
from tracer.ir.reference import REFERENCE
from tracer.ir.text import format_function, parse_function, same_function
from tracer.ir.types import TensorType
from tracer.ir.verify import VerificationError, verify
from tracer.ir.vjp import VJP_RULES, CustomRule, apply_vjp
from tracer.ir.autodiff import expand_gradients, reaches
