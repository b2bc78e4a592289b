"""How inference observes a module beyond its signature: by calling it (:mod:`.probing`: the
mask convention, causality, sequence-first inputs), by hooks on its submodules
(:mod:`.tracing`), at its attention core (:mod:`.core_observed`)."""
