"""What the table and Markdown views say, one module per topic: each helper reads a record
and returns plain text or plain structures, which each view then styles or escapes.

Modules here name each other by their full path; this package's `__init__` holds nothing.
"""
