"""How the module is called and what its call's arguments take, settled by trial: a forward
that names no input (:mod:`.variadic_call`), a guessed call form (:mod:`.packed_call`), packed
tokens (:mod:`.packing`), a KV cache argument (:mod:`.kv_cache`), a sliding-window argument's
count (:mod:`.window`)."""
