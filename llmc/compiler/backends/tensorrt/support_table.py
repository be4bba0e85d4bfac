"""What TensorRT's ONNX parser accepts: operators, their types, the restrictions we check.

Source: onnx/onnx-tensorrt ``docs/operators.md``, "Supported ONNX Operators", the table of the
TensorRT 10.15 release ("TensorRT 10.15 supports operators in the inclusive range of opset 9 to
opset 24"), the newest published table we could find. The onnx-tensorrt changelog for 10.15 adds
``RotaryEmbedding``, ``RMSNormalization`` and ``TensorScatter``, which this graph relies on. No
TensorRT 11 table was available to us; TensorRT 11 removed the weakly typed builder flags, not
parser operators, so we use the 10.15 table for TensorRT 11 and say so in every lint report.
Nothing here has been checked against a real parser (``import tensorrt`` is impossible on our
machines, DESIGN §6).

Type names follow the table: FP32, FP16, BF16, FP8, FP4, INT4, INT8, INT32, INT64, UINT8, BOOL.
"""

from __future__ import annotations

from onnx import TensorProto

SOURCE = "onnx-tensorrt docs/operators.md (TensorRT 10.15 table; TensorRT 11 assumed equal)"
OPSET_MIN, OPSET_MAX = 9, 24

TYPE_NAMES = {
    TensorProto.FLOAT: "FP32",
    TensorProto.FLOAT16: "FP16",
    TensorProto.BFLOAT16: "BF16",
    TensorProto.FLOAT8E4M3FN: "FP8",
    TensorProto.FLOAT4E2M1: "FP4",
    TensorProto.INT4: "INT4",
    TensorProto.INT8: "INT8",
    TensorProto.INT32: "INT32",
    TensorProto.INT64: "INT64",
    TensorProto.UINT8: "UINT8",
    TensorProto.BOOL: "BOOL",
    TensorProto.DOUBLE: "DOUBLE",
}

_F = "FP32 FP16 BF16"
_FI = "FP32 FP16 BF16 INT32 INT64"
_FIB = "FP32 FP16 BF16 INT32 INT64 BOOL"
_ALL = "FP32 FP16 BF16 FP8 FP4 INT4 INT32 INT64 BOOL"

# operator -> supported types of its data input ("Supported Types" column, rows marked Y).
_SUPPORTED = {
    **dict.fromkeys(
        "Acos Acosh Asin Asinh Atan Atanh AveragePool BatchNormalization Ceil Celu Clip Conv "
        "ConvTranspose Cos Cosh CumSum Dropout Einsum Elu Erf Exp Floor Gemm GlobalAveragePool "
        "GlobalLpPool GlobalMaxPool GroupNormalization GRU HardSigmoid HardSwish Hardmax "
        "ImageScaler InstanceNormalization IsInf LayerNormalization LeakyRelu Log LogSoftmax "
        "LRN LSTM LpNormalization LpPool MatMul MaxPool MeanVarianceNormalization "
        "ParametricSoftplus PRelu QuantizeLinear RandomNormal RandomNormalLike RandomUniform "
        "RandomUniformLike Reciprocal Resize RMSNormalization RNN RotaryEmbedding Round "
        "ScaledTanh Scan Selu Sigmoid Sin Sinh Softmax Softplus Softsign Sqrt Tan Tanh "
        "ThresholdedRelu Upsample".split(),
        _F,
    ),
    **dict.fromkeys(
        "Abs Add ArgMax ArgMin DepthToSpace Div Equal Greater GreaterOrEqual IsNaN Less "
        "LessOrEqual Max Min Mod Mul Neg Pad Pow Range ReduceL1 ReduceL2 ReduceLogSum "
        "ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare "
        "Relu Scatter ScatterElements ScatterND Shrink Sign SpaceToDepth Sub Sum TopK".split(),
        _FI,
    ),
    **dict.fromkeys(
        "Concat Expand EyeLike Flatten Gather GatherElements GatherND Identity If Loop "
        "ReverseSequence Reshape Shape Size Slice Split Squeeze Tile Transpose Trilu Unsqueeze "
        "Where".split(),
        _FIB,
    ),
    **dict.fromkeys("And Not Or Xor".split(), "BOOL"),
    **dict.fromkeys("Constant ConstantOfShape".split(), _ALL),
    "Attention": "FP32 FP16 BF16 INT8 FP8",
    "BlackmanWindow": "FP32 FP16",
    "HammingWindow": "FP32 FP16",
    "HannWindow": "FP32 FP16",
    "Cast": "FP32 FP16 BF16 INT32 INT64 UINT8 BOOL",
    "CastLike": "FP32 FP16 BF16 INT32 INT64 UINT8 BOOL",
    "DeformConv": "FP32 FP16",
    "DequantizeLinear": "INT8 FP8 FP4 INT4",
    "Gelu": "FP32 FP16 BF16 INT8 INT32 INT64",
    "GridSample": "FP32 FP16",
    "Mean": "FP32 FP16 BF16 FP8 INT32 INT64",
    "Mish": "FP32 FP16",
    "NonMaxSuppression": "FP32 FP16",
    "NonZero": "FP32 FP16",
    "OneHot": _FIB,
    "RoiAlign": "FP32 FP16",
    "STFT": "FP32",
    "TensorScatter": "FP32 FP16 BF16 INT32",
}
SUPPORTED: dict[str, frozenset[str]] = {op: frozenset(t.split()) for op, t in _SUPPORTED.items()}

#: Rows marked N in the table (listed so a lint message can say "marked unsupported").
UNSUPPORTED = frozenset(
    "AffineGrid Bernoulli BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor Col2Im "
    "CenterCropPad Compress ConcatFromSequence ConvInteger DFT Det DynamicQuantizeLinear "
    "ImageDecoder MatMulInteger MaxRoiPool MaxUnpool MelWeightMatrix Multinomial "
    "NegativeLogLikelihoodLoss Optional OptionalGetElement OptionalHasElement QLinearConv "
    "QLinearMatMul RegexFullMatch SequenceAt SequenceConstruct SequenceEmpty SequenceErase "
    "SequenceInsert SequenceLength SequenceMap SoftmaxCrossEntropyLoss SplitToSequence "
    "StringConcat StringNormalizer StringSplit TfIdfVectorizer Unique".split()
)

#: Inputs the table requires to be build-time constants (initializers / Constant outputs):
#: op -> input indices ("must be an initializer", "must be resolvable to a constant",
#: "must be a build-time constant").
CONSTANT_INPUTS = {
    **dict.fromkeys(
        "ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin "
        "ReduceProd ReduceSum ReduceSumSquare Squeeze Unsqueeze CumSum".split(),
        (1,),
    ),
    "OneHot": (1,),
    "STFT": (1, 2),
}

#: Inputs TensorRT reads as shape tensors (their values set output shapes). Their values must be
#: computable from shapes and constants, not from tensor data (TensorRT developer guide, "Shape
#: Tensors": execution tensors cannot feed shape tensor inputs).
SHAPE_INPUTS = {
    "Reshape": (1,),
    "Expand": (1,),
    "Tile": (1,),
    "Slice": (1, 2, 3, 4),
    "ConstantOfShape": (0,),
    "Range": (0, 1, 2),
    "Resize": (2, 3),
    "TopK": (1,),
    "Pad": (1, 3),
    "Split": (1,),
    "Squeeze": (1,),
    "Unsqueeze": (1,),
    "EyeLike": (0,),
}

#: Ops whose outputs have data-dependent shapes (their values are data, never shape tensors).
DATA_DEPENDENT = frozenset({"NonZero", "NonMaxSuppression", "Unique"})

#: Per-op attribute restrictions from the table's "Restrictions" column: (attr, allowed values).
ATTRIBUTE_RULES = {
    "ScatterND": [("reduction", {"none", b"none"})],
    "TopK": [("sorted", {1})],
    "LSTM": [("input_forget", {0}), ("layout", {0})],
    "Resize": [("antialias", {0})],
    "Attention": [("softcap", {0.0}), ("qk_matmul_output_mode", {0})],
    "TensorScatter": [("axis", {-2})],
}
