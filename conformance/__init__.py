"""attention-conformance: property-based conformance checks for attention layers.

Declare an implementation, then run the catalogue on it::

    import conformance

    @conformance.implementation("my-mha", call="self",
                                weights=conformance.SeparateProjections("q", "k", "v", "o"))
    def my_mha(config: conformance.Config):
        return MyMultiHeadAttention(config.d_model, config.num_heads)

    for result in conformance.check(my_mha):
        print(result.check, result.status.value, result.reason)
"""

from conformance.adapter import ImplementationError, Inputs, Instance, Subject
from conformance.catalogue import CHECK_NAMES, Runner, check, check_many
from conformance.inference import Declarations, Inferred, infer, infer_function
from conformance.registry import ResolveError, implementation, register, registered, resolve
from conformance.results import CheckResult, Status
from conformance.spec import (
    AlibiBias,
    CacheStyle,
    Capabilities,
    Config,
    Implementation,
    MaskConvention,
    MaskKind,
    MaskLayout,
    PackedForm,
    PositionEncoding,
    PositionForm,
    Rotary,
)
from conformance.weights import (
    FusedProjection,
    HeadWeights,
    PackedInProjection,
    PerHeadModules,
    SeparateProjections,
    WeightLayout,
)

__version__ = "0.1.0"

__all__ = [
    "CHECK_NAMES",
    "AlibiBias",
    "CacheStyle",
    "Capabilities",
    "CheckResult",
    "Config",
    "Declarations",
    "FusedProjection",
    "HeadWeights",
    "Implementation",
    "ImplementationError",
    "Inferred",
    "Inputs",
    "Instance",
    "MaskConvention",
    "MaskKind",
    "MaskLayout",
    "PackedForm",
    "PackedInProjection",
    "PerHeadModules",
    "PositionEncoding",
    "PositionForm",
    "ResolveError",
    "Rotary",
    "Runner",
    "SeparateProjections",
    "Status",
    "Subject",
    "WeightLayout",
    "__version__",
    "check",
    "check_many",
    "implementation",
    "infer",
    "infer_function",
    "register",
    "registered",
    "resolve",
]
