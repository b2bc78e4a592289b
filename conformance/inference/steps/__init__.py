"""The steps :func:`~conformance.inference.infer.infer` drives once the class builds and is
called (:mod:`conformance.inference.construction`), each ``step(inquiry)`` on one
:class:`~conformance.inference.inquiry.Inquiry`: what it does (:mod:`.behaviour`), positions
(:mod:`.position`), the state it keeps (:mod:`.state`), its features (:mod:`.features`), the
paths forward offers (:mod:`.paths`), the scale its design sets (:mod:`.scale`), queries of its
own (:mod:`.latent`)."""
