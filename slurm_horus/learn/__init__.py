"""Learning from history: co-location observations and model refits (store + interference)."""
