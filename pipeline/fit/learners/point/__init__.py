"""The point learners on DP weights (Lim & Jiang 2024): MM, the SGA family and SVI."""
