"""How a class is constructed, found by behaviour: a config object its constructor takes
(:mod:`.config_object`)."""
