"""VB EM and its passes: plain, truncated, memoized, moves, growth; and vbem-ps (VB EM with
pattern search)."""
