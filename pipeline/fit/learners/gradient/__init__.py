"""The gradient learners on the exact bound: GD, CG, NG, NCG (Kuusela et al. 2009)."""
