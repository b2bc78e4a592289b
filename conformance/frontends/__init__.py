"""What a user drives: the command line, the pytest plugin and its catalogue fixtures, the text and
JSON reports, the progress line, and the advice in the language of the interface in use.
"""
