"""Finding implementations: the registry (``@implementation``, entry points) and IMPL strings
(a registered name, ``module:Attr``, ``file.py::Attr``), loaded and, where nothing is declared,
inferred.
"""
