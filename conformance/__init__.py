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

from __future__ import annotations

from typing import TYPE_CHECKING

from conformance._version import __version__

# The public names and the module each lives in. They are imported on first use (PEP 562), so
# `import conformance` (and the pytest plugin, which pytest loads in every run of an environment
# the suite is installed in) costs nothing until something is used.
_EXPORTS = {
    "conformance.frontends.python_api": ("check", "check_many", "infer", "infer_function"),
    "conformance.inference.plan": ("Inferred",),
    "conformance.loading.registry": ("ResolveError", "implementation", "register", "registered",
                                     "resolve"),
    "conformance.model.capability_groups": ("CacheForm", "CausalForm", "Dtypes", "Packing",
                                            "Positions"),
    "conformance.model.check_names": ("CHECK_NAMES",),
    "conformance.model.declarations": ("Declarations",),
    "conformance.model.results": ("CheckResult", "Status"),
    "conformance.model.forms": ("AlibiBias", "CacheStyle", "PackedForm", "PositionEncoding",
                                "PositionForm", "Rotary", "Setting"),
    "conformance.model.mask_forms": ("MaskConvention", "MaskKind", "MaskLayout"),
    "conformance.model.spec": ("Capabilities", "Config", "Implementation"),
    "conformance.model.declared_layouts": ("FusedProjection", "PackedInProjection",
                                           "PerHeadModules", "SeparateProjections"),
    "conformance.model.weights": ("HeadWeights", "WeightLayout"),
    "conformance.run.runner": ("Runner",),
    "conformance.subject.boundary": ("ImplementationError", "Inputs", "Instance", "Subject"),
}

__all__ = [
    "CHECK_NAMES", "AlibiBias", "CacheForm", "CacheStyle", "Capabilities", "CausalForm",
    "CheckResult", "Config", "Declarations", "Dtypes", "FusedProjection", "HeadWeights",
    "Implementation", "ImplementationError", "Inferred", "Inputs", "Instance", "MaskConvention",
    "MaskKind", "MaskLayout", "PackedForm", "PackedInProjection", "Packing", "PerHeadModules",
    "PositionEncoding", "PositionForm", "Positions", "ResolveError", "Rotary", "Runner",
    "SeparateProjections", "Setting", "Status", "Subject", "WeightLayout",
    "__version__",
    "check", "check_many", "implementation", "infer", "infer_function", "register", "registered",
    "resolve",
]


def __getattr__(name: str) -> object:
    from conformance._exports import export  # on first use only: `import conformance` loads none

    return export("conformance", globals(), name, _EXPORTS)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:
    # The public functions are frontends.python_api's wrappers of these (the same signatures;
    # the root may not import the front ends, whose layer is above the bundled implementations
    # that import the root).
    from conformance.inference.functions.core_function import infer_function
    from conformance.inference.infer import infer
    from conformance.inference.plan import Inferred
    from conformance.loading.registry import (
        ResolveError,
        implementation,
        register,
        registered,
        resolve,
    )
    from conformance.model.capability_groups import CacheForm, CausalForm, Dtypes, Packing, Positions
    from conformance.model.check_names import CHECK_NAMES
    from conformance.model.declarations import Declarations
    from conformance.model.declared_layouts import (
        FusedProjection,
        PackedInProjection,
        PerHeadModules,
        SeparateProjections,
    )
    from conformance.model.forms import (
        AlibiBias,
        CacheStyle,
        PackedForm,
        PositionEncoding,
        PositionForm,
        Rotary,
        Setting,
    )
    from conformance.model.mask_forms import MaskConvention, MaskKind, MaskLayout
    from conformance.model.results import CheckResult, Status
    from conformance.model.spec import Capabilities, Config, Implementation
    from conformance.model.weights import HeadWeights, WeightLayout
    from conformance.run.many import check, check_many
    from conformance.run.runner import Runner
    from conformance.subject.boundary import ImplementationError, Inputs, Instance, Subject
