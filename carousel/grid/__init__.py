"""The grid's door: the WLCG Tape REST semantics (door.py) and WLCG bearer tokens (tokens.py)."""
