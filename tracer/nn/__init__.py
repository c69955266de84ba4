"""`tr.nn`: PyTorch's Module, Parameter and layers; `tr.nn.functional` holds the functions."""
from tracer.nn import functional, parallel
from tracer.nn.containers import ModuleDict, ModuleList, Sequential
from tracer.nn.modules import (GELU, Dropout, Embedding, LayerNorm, Linear, Module, Parameter, ReLU,
                               SiLU, Tanh)

__all__ = ["functional", "parallel", "Module", "Parameter", "Linear", "Embedding", "LayerNorm", "Dropout",
           "Sequential", "ModuleList", "ModuleDict", "ReLU", "GELU", "SiLU", "Tanh"]
