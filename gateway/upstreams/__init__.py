"""One module per upstream dialect: its request flags and its parser into canonical tokens."""
