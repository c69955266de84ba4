"""The SSA intermediate representation: types, graph, primitives and their tables, passes."""
from ir.builder import ArrayBuilder, Builder, GraphBuilder
from ir.graph import Function, Instruction, Value
from ir.interpreter import interpret
from ir.passes import cse, dce, fold_constants, optimize, simplify
from ir.primitives import DIRECTIVES, PRIMITIVES, SHAPE_RULES, ShapeError, infer_types
from ir.reference import REFERENCE
from ir.text import format_function, parse_function, same_function
from ir.types import TensorType
from ir.verify import VerificationError, verify
from ir.vjp import VJP_RULES, CustomRule, apply_vjp
from ir.autodiff import expand_gradients, reaches
