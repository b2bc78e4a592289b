"""What names say, read without running anything: the constructor's parameters by role
(:mod:`.roles`), how ``forward`` is called (:mod:`.convention`), a position encoding suggested by
what the module holds and takes (:mod:`.positional`)."""
