"""One module per check: each states its property in its docstring and checks exactly that."""
