"""The steps :func:`~conformance.inference.infer.infer` drives, each ``step(inquiry)`` on one
:class:`~conformance.inference.inquiry.Inquiry`: building and calling the class
(:mod:`.construction`, with :mod:`.trial` and :mod:`.fixed_sizes` settling what its constructor
needs), what it does (:mod:`.behaviour`), positions (:mod:`.position`), the state it keeps
(:mod:`.state`), its features (:mod:`.features`), queries of its own (:mod:`.latent`)."""
