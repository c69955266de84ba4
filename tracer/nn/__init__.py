"""`tr.nn`: PyTorch's Module, Parameter and layers; `tr.nn.functional` holds the functions."""
from tracer.nn import functional
from tracer.nn.containers import ModuleDict, ModuleList, Sequential
from tracer.nn.layers import (AdaptiveAvgPool2d, AvgPool2d, BatchNorm1d, BatchNorm2d, Conv1d,
                              Conv2d, ConvTranspose2d, MaxPool2d)
from tracer.nn.modules import (GELU, Dropout, Embedding, LayerNorm, Linear, Module, Parameter, ReLU,
                               SiLU, Tanh)

__all__ = ["functional", "Module", "Parameter", "Linear", "Embedding", "LayerNorm", "Dropout",
           "Sequential", "ModuleList", "ModuleDict", "ReLU", "GELU", "SiLU", "Tanh",
           "Conv1d", "Conv2d", "ConvTranspose2d", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d",
           "BatchNorm1d", "BatchNorm2d"]
