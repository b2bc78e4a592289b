"""Generated cases: the integers hypothesis draws and shrinks (``Case``), the strategies that draw
them for what an implementation declares, the configurations it can be built for, and the
suite's hypothesis profiles.
"""
