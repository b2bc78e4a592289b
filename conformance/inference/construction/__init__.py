"""How a class is built and called, found by behaviour (names only order the search), before
the steps explore it: the constructor's roles and forward's convention, the configurations it
builds for, its output's form (:mod:`.build_and_call`); a config object it takes and the fields
the layer reads from it (:mod:`.config_object`); required arguments no name explains, the width
and head count among them (:mod:`.trial`); a role a name suggested, confirmed or not
(:mod:`.named_roles`); the width and head count a module fixes itself (:mod:`.fixed_sizes`); the
one length a layer takes (:mod:`.fixed_length`, Swin's window) and the longest it takes
(:mod:`.longest_length`)."""
