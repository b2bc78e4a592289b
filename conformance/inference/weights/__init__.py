"""The weights and position encoding, found by reproducing the module's float64 output: the
weight step (:mod:`.weight_roles`), its search (:mod:`.weight_search`: trace, candidates,
interventions), the projections by name and shape (:mod:`.projections`), the encoding hypotheses
(:mod:`.encoding_search`, :mod:`.rotary_found`) and the reproduction's sizes
(:mod:`.reproduction`)."""
