"""`tr.nn`: PyTorch's Module, Parameter and layers; `tr.nn.functional` holds the functions."""
from tracer.nn import functional, init, parallel, utils
from tracer.nn.activation_modules import (CELU, ELU, GLU, SELU, Hardsigmoid, Hardswish,
                                          Hardtanh, LeakyReLU, LogSigmoid, LogSoftmax, Mish,
                                          PReLU, ReLU, ReLU6, Sigmoid, SiLU, Softmax, Softmin,
                                          Softsign, Tanhshrink, Threshold)
from tracer.nn.distance_modules import CosineSimilarity, PairwiseDistance
from tracer.nn.containers import ModuleDict, ModuleList, Sequential
from tracer.nn.loss_modules import (BCELoss, BCEWithLogitsLoss, CosineEmbeddingLoss, HuberLoss,
                                     KLDivLoss, MarginRankingLoss, SmoothL1Loss, SoftMarginLoss)
from tracer.nn.losses import CrossEntropyLoss, L1Loss, MSELoss, NLLLoss
from tracer.nn.layers import (AdaptiveAvgPool2d, AvgPool2d, BatchNorm1d, BatchNorm2d, Conv1d,
                              Conv2d, ConvTranspose2d, EmbeddingBag, MaxPool2d)
from tracer.nn.modules import (GELU, Dropout, Embedding, LayerNorm, Linear, Module, Parameter,
                               Softplus, Tanh)
from tracer.nn.recurrent import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell
from tracer.nn.multihead import MultiheadAttention
from tracer.nn.norm_layers import GroupNorm, InstanceNorm1d, InstanceNorm2d, RMSNorm
from tracer.nn.transformer import (Transformer, TransformerDecoder, TransformerDecoderLayer,
                                    TransformerEncoder, TransformerEncoderLayer)
from tracer.nn.shaping import Flatten, Identity, Unflatten
from tracer.nn.pooling_modules import (AdaptiveAvgPool1d, AdaptiveMaxPool1d, AdaptiveMaxPool2d,
                                     AvgPool1d, MaxPool1d)
from tracer.nn.upsampling import Upsample, UpsamplingBilinear2d, UpsamplingNearest2d
from tracer.nn.image_modules import (ChannelShuffle, Dropout1d, Dropout2d, Fold, PixelShuffle,
                                     PixelUnshuffle, Unfold)
from tracer.nn.padding_modules import (CircularPad1d, CircularPad2d, ConstantPad1d, ConstantPad2d,
                                       ReflectionPad1d, ReflectionPad2d, ReplicationPad1d,
                                       ReplicationPad2d, ZeroPad1d, ZeroPad2d)

__all__ = ["functional", "init", "parallel", "utils", "Module", "Parameter", "Linear",
           "Embedding", "LayerNorm", "Dropout", "Sequential", "ModuleList", "ModuleDict", "ReLU",
           "GELU", "SiLU", "Tanh", "Softplus", "Hardtanh", "ReLU6", "Flatten", "Unflatten",
           "Identity", "MSELoss", "L1Loss",
           "NLLLoss", "CrossEntropyLoss", "Conv1d", "Conv2d", "ConvTranspose2d", "MaxPool2d",
           "AvgPool2d", "AdaptiveAvgPool2d", "BatchNorm1d", "BatchNorm2d", "RNN", "LSTM", "GRU",
           "RNNCell", "LSTMCell", "GRUCell", "EmbeddingBag"]
__all__ += ["GroupNorm", "InstanceNorm1d", "InstanceNorm2d", "RMSNorm"]
__all__ += ["MultiheadAttention"]
__all__ += ["TransformerEncoderLayer", "TransformerEncoder", "TransformerDecoderLayer",
            "TransformerDecoder", "Transformer"]
__all__ += ["MaxPool1d", "AvgPool1d", "AdaptiveAvgPool1d", "AdaptiveMaxPool1d",
            "AdaptiveMaxPool2d"]
__all__ += ["Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d"]
__all__ += ["PixelShuffle", "PixelUnshuffle", "ChannelShuffle", "Unfold", "Fold", "Dropout1d",
            "Dropout2d", "ZeroPad1d", "ZeroPad2d", "ConstantPad1d", "ConstantPad2d",
            "ReflectionPad1d", "ReflectionPad2d", "ReplicationPad1d", "ReplicationPad2d",
            "CircularPad1d", "CircularPad2d"]
__all__ += ["Sigmoid", "LogSigmoid", "Softsign", "Tanhshrink", "SELU", "Mish", "Hardswish",
            "Hardsigmoid", "LeakyReLU", "ELU", "CELU", "Threshold", "GLU", "Softmax",
            "LogSoftmax", "Softmin", "PReLU"]
__all__ += ["BCELoss", "BCEWithLogitsLoss", "KLDivLoss", "HuberLoss", "SmoothL1Loss",
            "SoftMarginLoss", "CosineEmbeddingLoss", "MarginRankingLoss"]
__all__ += ["CosineSimilarity", "PairwiseDistance"]
