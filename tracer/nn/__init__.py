"""`tr.nn`: PyTorch's Module, Parameter and layers; `tr.nn.functional` holds the functions."""
from tracer.nn import functional, init, parallel, utils
from tracer.nn.containers import ModuleDict, ModuleList, Sequential
from tracer.nn.losses import CrossEntropyLoss, L1Loss, MSELoss, NLLLoss
from tracer.nn.modules import (GELU, Dropout, Embedding, LayerNorm, Linear, Module, Parameter, ReLU,
                               SiLU, Tanh)
from tracer.nn.shaping import Flatten, Identity, Unflatten

__all__ = ["functional", "init", "parallel", "utils", "Module", "Parameter", "Linear",
           "Embedding", "LayerNorm", "Dropout", "Sequential", "ModuleList", "ModuleDict", "ReLU",
           "GELU", "SiLU", "Tanh", "Flatten", "Unflatten", "Identity", "MSELoss", "L1Loss",
           "NLLLoss", "CrossEntropyLoss"]
