"""The function route: a plain attention function (a kernel) checked inside the suite's own
projections (:mod:`.core_function`, which hands the wrapper class to
:func:`~conformance.inference.infer.infer`); the kernel's own keywords (:mod:`.kernel_arguments`),
its KV-cache (:mod:`.cache_function`) and varlen (:mod:`.varlen_function`) forms."""
